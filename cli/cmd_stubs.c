// Commands whose implementation lands with later work report it plainly.
#include "base/err.h"
#include "cli/cli.h"

int cmd_convert(int argc, char **argv) {
    (void)argc, (void)argv;
    return cli_fail(err_set(ERR_UNSUP, "convert is not implemented yet"));
}
