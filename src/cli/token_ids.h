/* Token ids given on the command line: "1,2,3", or @FILE holding ids
 * separated by commas or whitespace. Strict, so that a typo is an error and
 * not a different prompt: "1,,2" is refused, not read as two ids. */
#ifndef RP_CLI_TOKEN_IDS_H
#define RP_CLI_TOKEN_IDS_H

#include <stdint.h>

/* Reads arg (the value of flag) into *ids (malloc'd) and *n, each id below
 * vocab. 0, or RP_EXIT_USAGE with the message printed: it names the flag,
 * the id at fault, and for an unreadable @FILE the file and the reason. */
int rp_cli_read_ids(const char *flag, const char *arg, int vocab, int32_t **ids, int *n, const char *cmd);

#endif
