// Reports people can look at: an HTML page with inline SVG plots drawn from a
// result JSON (hylo eval / hylo bench): the short-benchmark accuracies as bars
// (beside the teacher's when there is one), the RULER heat map task x length
// and the average per length, perplexity, latency and memory curves, and the
// training curves of a metrics file. Everything on the page comes from the
// JSON, so a report can be drawn again from a saved result.
#pragma once
#include <cjson/cJSON.h>

// The page for `result`; `against` (the teacher's result, or NULL) is drawn
// beside it. *html is malloc'ed.
int ev_report_html(const cJSON *result, const cJSON *against, char **html);

// A metrics JSONL file (one JSON object a line with "step" and any number of
// numeric fields whose names contain "loss") as the result's "training"
// section: {"file": path, "series": {"loss": [[step, value], ...], ...}}.
// Lines without "step" are skipped; a file without any loss is ERR_INPUT.
int ev_read_metrics(const char *path, cJSON **out);
