#include "base/err.h"
#include "cli/cli.h"
int cmd_generate(int argc, char **argv) { (void)argc, (void)argv; return cli_fail(err_set(ERR_UNSUP, "generate: not implemented yet")); }
int cmd_chat(int argc, char **argv) { (void)argc, (void)argv; return cli_fail(err_set(ERR_UNSUP, "chat: not implemented yet")); }
int cmd_export(int argc, char **argv) { (void)argc, (void)argv; return cli_fail(err_set(ERR_UNSUP, "export: not implemented yet")); }
