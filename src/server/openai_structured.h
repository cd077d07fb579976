/* Structured output fields of an OpenAI request (docs/server.md,
 * docs/structured.md): OpenAI's response_format, vLLM's structured_outputs
 * and its older guided_* fields, read into one engine constraint. Whether
 * the constraint compiles is the engine's to say, at submit. */
#ifndef RP_SERVER_OPENAI_STRUCTURED_H
#define RP_SERVER_OPENAI_STRUCTURED_H

#include <jansson.h>

#include "server/openai.h"

/* Sets out->params.constraint from the request's fields (its text owned by
 * out->constraint_text); none: RP_CONSTRAINT_NONE. A chat answer under a
 * reasoning parser is constrained after its `</think>` (vLLM's rule). Two
 * constraints, a malformed field or an option replay does not have: -1, a
 * 400 naming the field. */
int rp_oai_parse_structured(const rp_oai_context *ctx, rp_oai_kind kind, json_t *root, rp_oai_request *out,
                            rp_oai_error *err);

#endif
