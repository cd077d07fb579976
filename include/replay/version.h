/* replay's version: `replay --version`, GET /version. */
#ifndef REPLAY_VERSION_H
#define REPLAY_VERSION_H

#define REPLAY_VERSION "0.1.0"

#endif
