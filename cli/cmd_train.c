// hylo train RECIPE.yaml: stage 1 (Enhanced-ILD) or stage 2 (KD) of the HyLo
// recipe, as the recipe's ILD key says.
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/log.h"
#include "cli/cli.h"
#include "io/recipe.h"
#include "io/weights.h"
#include "train/dist.h"
#include "train/trainer.h"

static const char *help = "usage: hylo train RECIPE.yaml [options]\n"
                          "\n"
                          "Trains a hybrid student by distillation from its teacher, as the recipe says:\n"
                          "  ILD: true   stage 1, layer-wise distillation: every student layer runs from the\n"
                          "              teacher's input to that layer; loss = sum over layers of the token-mean\n"
                          "              L2 distance of the layer outputs plus that of the mixer outputs\n"
                          "  ILD: false  stage 2, end-to-end KD: kl_weight x KL(teacher || student) (per sequence,\n"
                          "              'batchmean') + ce_weight x CE, through fused hidden-state losses\n"
                          "\n"
                          "The student is model_name_or_path when that is a hybrid checkpoint folder; otherwise\n"
                          "it is built first, as 'hylo convert --recipe RECIPE' would, into OUTPUT_DIR/init: the\n"
                          "teacher upcycled by mla_layers / linear_type (stage 1: all-MLA or all-linear), or\n"
                          "assembled from mla_ILD_path and linear_ILD_path (stage 2).\n"
                          "Training data: dataset_mixer: {SHARDS: 1.0}, token shards made by 'hylo data'.\n"
                          "Every setting, defaults included, is printed at start; docs/TRAINING.md lists the keys.\n"
                          "\n"
                          "Writes into output_dir: checkpoint-STEP/ every save_steps optimizer steps and at the end\n"
                          "(each a hybrid folder that generate / chat / compare load, plus optimizer.safetensors,\n"
                          "trainer_state.json and loss.svg; the last save_total_limit are kept), metrics.jsonl (one\n"
                          "line per logging step) and loss.svg. Ctrl-C (or SIGTERM) saves a checkpoint and exits.\n"
                          "\n"
                          "Many GPUs (or CPU processes): mpirun -np N hylo train RECIPE.yaml runs N data-parallel\n"
                          "ranks, each with per_device_train_batch_size rows of its own slice of the data and a\n"
                          "1/N slice of the optimizer state (ZeRO-1); rank 0 logs and saves. The checkpoints resume\n"
                          "on any number of ranks (docs/TRAINING.md).\n"
                          "\n"
                          "options (override the recipe):\n"
                          "  --resume          continue from the newest checkpoint in output_dir: the same losses\n"
                          "                    as a run that was never interrupted\n"
                          "  --device D        cpu or cuda (recipe key 'device', default cpu)\n"
                          "  --max-steps N     stop after N optimizer steps\n"
                          "  --out DIR         output_dir\n"
                          "  --force-collectives  run the data-parallel collectives (NCCL on cuda, MPI on cpu) with\n"
                          "                    one rank too: checks that path on one device; the losses are the same\n";

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

// A student that is not a hybrid yet is built by convert from the recipe (by
// rank 0 when build is set; the other ranks wait for it at a barrier).
static int build_student(train_cfg_t *c, const char *recipe, int build) {
    arch_t a;
    wsrc_t *src;
    TRY(wsrc_open(&src, c->student, &a));
    wsrc_close(src);
    if (a.is_hybrid) return 0;
    char init[sizeof c->student];
    TRY(fs_join(init, sizeof init, c->out_dir, "init"));
    if (build && !fs_exists(init)) {
        printf("== building the student from %s (hylo convert --recipe %s --out %s)\n", c->student, recipe, init);
        fflush(stdout);
        char *argv[] = {"convert", "--recipe", (char *)recipe, "--out", init, NULL};
        if (cmd_convert(5, argv) != 0) return err_set(ERR_INPUT, "building the student from %s failed", c->student);
    }
    memcpy(c->student, init, sizeof init);
    return 0;
}

int cmd_train(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(help, stdout);
        return 0;
    }
    const char *recipe_path = NULL, *device = NULL, *out = NULL;
    long max_steps = 0;
    int resume = 0, force_collectives = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int r;
        if ((r = cli_opt("train", argc, argv, &i, "--device", &v))) {
            if (r < 0) return cli_fail(r);
            device = v;
        } else if ((r = cli_opt("train", argc, argv, &i, "--out", &v))) {
            if (r < 0) return cli_fail(r);
            out = v;
        } else if ((r = cli_opt("train", argc, argv, &i, "--max-steps", &v))) {
            if (r < 0 || (r = cli_int("train", "--max-steps", v, 1, 1L << 40, &max_steps)) < 0) return cli_fail(r);
        } else if (cli_flag(argv, i, "--resume")) {
            resume = 1;
        } else if (cli_flag(argv, i, "--force-collectives")) {
            force_collectives = 1;
        } else if (argv[i][0] == '-') {
            return cli_usage("train", "unknown option '%s'", argv[i]);
        } else if (!recipe_path) {
            recipe_path = argv[i];
        } else {
            return cli_usage("train", "unexpected argument '%s'", argv[i]);
        }
    }
    if (!recipe_path) return cli_usage("train", "expected a RECIPE.yaml");
    if (device && strcmp(device, "cpu") && strcmp(device, "cuda"))
        return cli_usage("train", "--device must be cpu or cuda");
    train_cfg_t c;
    train_cfg_defaults(&c);
    recipe_t rec = {0};
    int rc = recipe_load(&rec, recipe_path);
    if (rc == 0) rc = train_cfg_from_recipe(&c, &rec);
    recipe_free(&rec);
    if (rc < 0) return cli_fail(rc);
    if (device) snprintf(c.device, sizeof c.device, "%s", device);
    if (out) snprintf(c.out_dir, sizeof c.out_dir, "%s", out);
    if (max_steps) c.max_steps = max_steps;
    c.resume = resume;
    c.stop = &stop_requested;
    if (!c.out_dir[0]) return cli_usage("train", "the recipe has no output_dir (or give --out)");
    if (!c.student[0]) return cli_usage("train", "the recipe has no model_name_or_path");
    // The ranks of an mpirun job, or one (a singleton) without it.
    dist_t d;
    if ((rc = dist_init(&d, &argc, &argv)) < 0) return cli_fail(rc);
    d.force = force_collectives;
    c.dist = &d;
    if (d.rank > 0) { // rank 0 speaks for the job; the others report only warnings and errors
        if (!freopen("/dev/null", "w", stdout)) return cli_fail(err_set(ERR_IO, "rank %d: /dev/null", d.rank));
        log_set_level(LOG_WARN);
    }
    if ((rc = fs_mkdir_p(c.out_dir)) < 0 || (rc = build_student(&c, recipe_path, d.rank == 0)) < 0 ||
        (rc = dist_barrier(&d)) < 0) {
        int code = cli_fail(rc);
        dist_abort(&d, code);
        dist_finalize(&d);
        return code;
    }
    printf("== hylo train %s\n", recipe_path);
    train_cfg_print(&c, stdout);
    fflush(stdout);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    rc = train_run(&c);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    int code = rc < 0 ? cli_fail(rc) : 0;
    if (code) dist_abort(&d, code); // the other ranks may wait in a collective
    dist_finalize(&d);
    return code;
}
