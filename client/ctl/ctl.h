/* ferryctl's subcommands. Each takes the arguments after its name (argv[0]
 * is the subcommand's name) and returns the process exit status. */
#ifndef FERRY_CTL_H
#define FERRY_CTL_H

int ferryctl_records(int argc, char **argv); /* records inspect|index */
int ferryctl_gen(int argc, char **argv);     /* gen */
int ferryctl_bench(int argc, char **argv);   /* bench pipeline */

/* True when stdout is a terminal (progress bars and colours). */
int ferryctl_isatty(void);

#endif /* FERRY_CTL_H */
