#!/usr/bin/env bash
# Run here: copies into .carry/lib/ the shared libraries hylo and its tests
# link that the GPU image lacks (cJSON, libyaml, PCRE2, cmocka, libmicrohttpd;
# libzstd in case the image has none). The one list the GPU scripts use.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .carry/lib
for l in libcjson.so.1 libyaml-0.so.2 libpcre2-8.so.0 libzstd.so.1 libcmocka.so.0 libmicrohttpd.so.12; do
    cp -L "/usr/lib/x86_64-linux-gnu/$l" .carry/lib/ 2>/dev/null || cp -L "/lib/x86_64-linux-gnu/$l" .carry/lib/
done
