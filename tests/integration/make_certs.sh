#!/usr/bin/env bash
# The test certificates, made with openssl at test time in DIR.
#   ca.pem/.key          the cluster's CA
#   server.pem/.key      signed by it, subjectAltName IP:127.0.0.1 and
#                        DNS:localhost, usable as server and client
#                        certificate (daemons and workers)
#   client.pem/.key      a client certificate signed by the CA
#   other-ca.pem/.key    an unrelated CA, and other-client.pem/.key and
#   other-server.pem/.key signed by it (for "wrong CA")
#   expired.pem/.key     a server certificate signed by the CA that expired
#                        in 2020 (openssl ca -startdate/-enddate)
#   tokens: worker.token, client.token, status.token, wrong.token (0600)
# Exit 0 on success; 77 when openssl is absent (the caller skips).
set -euo pipefail
dir=${1:?usage: make_certs.sh DIR}
command -v openssl >/dev/null 2>&1 || { echo "openssl not found" >&2; exit 77; }
mkdir -p "$dir"
cd "$dir"

req() { # NAME CN -> NAME.key NAME.csr
  openssl req -new -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" \
    -subj "/CN=$2" 2>/dev/null
}
mkca() { # NAME
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.pem" \
    -days 30 -subj "/CN=ferry test $1" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}
sign() { # NAME CA EXTFILE
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" \
    -CAcreateserial -out "$1.pem" -days 30 -extfile "$3" 2>/dev/null
}

cat > server.ext <<'EOF'
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=IP:127.0.0.1,DNS:localhost
EOF
cat > client.ext <<'EOF'
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
EOF

mkca ca
mkca other-ca
req server ferry-server && sign server ca server.ext
req client ferry-client && sign client ca client.ext
req other-client ferry-stranger && sign other-client other-ca client.ext
req other-server ferry-stranger && sign other-server other-ca server.ext

# An expired server certificate: `openssl ca` takes explicit dates.
mkdir -p ca-db
: > ca-db/index.txt
echo 1000 > ca-db/serial
cat > ca.cnf <<EOF
[ ca ]
default_ca = test_ca
[ test_ca ]
dir = $PWD/ca-db
database = \$dir/index.txt
serial = \$dir/serial
new_certs_dir = \$dir
certificate = $PWD/ca.pem
private_key = $PWD/ca.key
default_md = sha256
policy = any
unique_subject = no
copy_extensions = none
[ any ]
commonName = supplied
[ server_ext ]
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=IP:127.0.0.1,DNS:localhost
EOF
req expired ferry-expired
openssl ca -batch -config ca.cnf -extensions server_ext -in expired.csr \
  -out expired.pem -startdate 20200101000000Z -enddate 20200102000000Z \
  -notext 2>/dev/null

umask 077
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > worker.token
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > client.token
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > status.token
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > wrong.token
chmod 600 ./*.key ./*.token
echo "certificates in $PWD"
