/* The sampling options' ranges checked on the command line, before anything
 * loads, with the flag at fault named ("--top-p must be in (0, 1], got 0"). */
#ifndef RP_CLI_SAMPLING_OPTS_H
#define RP_CLI_SAMPLING_OPTS_H

struct rp_sampling_params;

/* 0, or RP_EXIT_USAGE with the message printed. */
int rp_sampling_opts_check(const struct rp_sampling_params *sp, const char *cmd);

#endif
