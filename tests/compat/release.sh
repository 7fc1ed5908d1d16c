# shellcheck shell=bash disable=SC2154
# Sourced by tests/compat/run.sh and tests/bench/compare_release.sh: the
# previous release (tests/compat/PREVIOUS_RELEASE) extracted with git
# archive and built, only the targets asked for.
#
#   release_commit            sets $release to the hash, or prints
#                             "SKIP: why" and returns 1 (no git, not a
#                             checkout, the commit not in the clone)
#   release_build DIR TYPE TARGET...
#                             extracts $release into DIR/src (once per
#                             hash: DIR/src/.ferry-release), configures
#                             DIR/build (CMAKE_BUILD_TYPE TYPE, no CUDA, no
#                             -Werror: an old tree's warnings on a newer
#                             compiler are not this test's business) and
#                             builds TARGET... with $jobs jobs
#   tree_build SRC DIR TYPE TARGET...
#                             the same configuration of the tree SRC in DIR
#
# The caller sets $root (the source tree) and $jobs (build parallelism).

release_commit() {
  local file=$root/tests/compat/PREVIOUS_RELEASE
  release=$(grep -v '^#' "$file" | tr -d ' \t' | grep -m1 . || true)
  if ! [[ $release =~ ^[0-9a-f]{40}$ ]]; then
    echo "$file: no full commit hash in it" >&2
    return 2
  fi
  if ! command -v git >/dev/null 2>&1; then
    echo "SKIP: git is not installed, so the previous release" \
      "${release:0:12} cannot be extracted"
    return 1
  fi
  if ! git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
    echo "SKIP: $root is not a git checkout, so the previous release" \
      "${release:0:12} cannot be extracted"
    return 1
  fi
  if ! git -C "$root" cat-file -e "$release^{commit}" 2>/dev/null; then
    echo "SKIP: the previous release ${release:0:12} is not in this clone" \
      "(a shallow clone? git fetch --unshallow, or fetch that commit)"
    return 1
  fi
}

# configure_and_build SRC BUILD TYPE TARGET...
configure_and_build() {
  local src=$1 build=$2 type=$3
  shift 3
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE="$type" \
    -DFERRY_WITH_CUDA=OFF -DFERRY_BUILD_TESTS=ON -DFERRY_WERROR=OFF \
    >"$build.configure.log" 2>&1 || {
    echo "cmake -S $src -B $build failed; its output:" >&2
    cat "$build.configure.log" >&2
    return 1
  }
  cmake --build "$build" -j "$jobs" --target "$@" >"$build.build.log" 2>&1 || {
    echo "building $* in $build failed; the end of its output:" >&2
    tail -n 40 "$build.build.log" >&2
    return 1
  }
}

release_build() {
  local dir=$1 type=$2
  shift 2
  mkdir -p "$dir"
  if [ "$(cat "$dir/src/.ferry-release" 2>/dev/null)" != "$release" ]; then
    rm -rf "$dir/src" "$dir/build"
    mkdir -p "$dir/src"
    git -C "$root" archive --format=tar "$release" | tar -x -C "$dir/src"
    echo "$release" >"$dir/src/.ferry-release"
  fi
  configure_and_build "$dir/src" "$dir/build" "$type" "$@"
}

tree_build() {
  local src=$1 dir=$2 type=$3
  shift 3
  mkdir -p "$dir"
  configure_and_build "$src" "$dir/build" "$type" "$@"
}
