#!/usr/bin/env bash
# Builds the training text of the first real HyLo run (docs/RESULTS.md, issue
# 10) from Debian's documentation packages, offline from any model hub:
#   scripts/corpus.sh OUT_DIR [EVAL_DIR]
# downloads the packages with `apt-get download` (no installation), unpacks
# them with dpkg-deb and turns each document into one UTF-8 .txt file under
# OUT_DIR/<package>/:
#   linux-doc-6.1     Documentation/**/*.rst (the kernel's reStructuredText)
#   python3.11-doc    the Sphinx sources (_sources/**/*.rst.txt)
#   perl-doc          *.pod through pod2text
#   git-doc           the AsciiDoc sources (*.txt)
#   manpages(-dev)    sections 1-8 through groff -man -Tutf8, without overstrike
#   postgresql-doc-15, sqlite3-doc, bash-doc: HTML through w3m -dump (installed
#                     from Debian when missing)
# OUT_DIR/SOURCES.tsv records each package's version, files and bytes.
# With EVAL_DIR (the evaluation data, e.g. ../shared/data), every line of 60 or
# more characters of its essays and evaluation sets is searched in the corpus
# (its first 60 characters as a fixed string, when they hold 8 or more words); OUT_DIR/OVERLAP.log lists the
# matches, and a file holding a match is removed from the corpus: evaluation
# text is never trained on.
# Packages are cached under $HYLO_CACHE/debs (default ~/.cache/hylo/debs).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/corpus.sh OUT_DIR [EVAL_DIR]" >&2; exit 2; }
out=$1
eval_dir=${2:-}
die() { echo "hylo: error: corpus: $*" >&2; exit 1; }
[ ! -e "$out" ] || die "$out exists; give a new folder"
[ -z "$eval_dir" ] || [ -d "$eval_dir" ] || die "evaluation folder $eval_dir does not exist"
cache="${HYLO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hylo}/debs"
pkgs=(linux-doc-6.1 python3.11-doc perl-doc git-doc manpages manpages-dev postgresql-doc-15 sqlite3-doc bash-doc)
mkdir -p "$cache"
for p in "${pkgs[@]}"; do
    ls "$cache/${p}"_*.deb >/dev/null 2>&1 && continue
    (cd "$cache" && apt-get download "$p" >/dev/null 2>&1) || die "apt-get download $p failed (is a Debian mirror reachable?)"
done
if ! command -v w3m >/dev/null; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "hylo: corpus: installing w3m (HTML to text)" >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends w3m >/dev/null ||
        die "cannot install w3m"
fi
tmp="$out.tmp.$$"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/deb"
for p in "${pkgs[@]}"; do
    mkdir -p "$tmp/deb/$p" "$tmp/text/$p"
    dpkg-deb -x "$(ls "$cache/${p}"_*.deb | head -n1)" "$tmp/deb/$p"
done
# One .txt per document, named after its path inside the package.
emit() { # package, source path, then the converter reads stdin / writes stdout
    local p=$1 src=$2 name
    name=$(echo "${src#"$tmp/deb/$p/"}" | tr '/' '_')
    name=${name%.gz}
    cat > "$tmp/text/$p/$name.txt"
}
unz() { case $1 in *.gz) zcat "$1" ;; *) cat "$1" ;; esac; }
while IFS= read -r f; do unz "$f" | emit linux-doc-6.1 "$f"; done < <(
    find "$tmp/deb/linux-doc-6.1" -path '*/Documentation/*' \( -name '*.rst.gz' -o -name '*.rst' -o -name '*.txt.gz' \) | sort)
while IFS= read -r f; do emit python3.11-doc "$f" < "$f"; done < <(find "$tmp/deb/python3.11-doc" -name '*.rst.txt' | sort)
while IFS= read -r f; do unz "$f" | pod2text 2>/dev/null | emit perl-doc "$f"; done < <(
    find "$tmp/deb/perl-doc" \( -name '*.pod' -o -name '*.pod.gz' \) | sort)
while IFS= read -r f; do emit git-doc "$f" < "$f"; done < <(find "$tmp/deb/git-doc" -name '*.txt' | sort)
for p in manpages manpages-dev; do
    while IFS= read -r f; do
        unz "$f" | groff -man -Tutf8 -P-cbou 2>/dev/null | emit $p "$f"
    done < <(find "$tmp/deb/$p" -path '*/man/man[1-8]/*' -name '*.gz' | sort)
done
for p in postgresql-doc-15 sqlite3-doc bash-doc; do
    while IFS= read -r f; do
        w3m -dump -T text/html -O UTF-8 -cols 100 "$f" 2>/dev/null | emit $p "$f"
    done < <(find "$tmp/deb/$p" -name '*.html' | sort)
done
# Drop near-empty documents (redirect pages, stubs) and non-UTF-8 files.
find "$tmp/text" -name '*.txt' -size -200c -delete
while IFS= read -r f; do iconv -f UTF-8 -t UTF-8 "$f" >/dev/null 2>&1 || rm -f "$f"; done < <(find "$tmp/text" -name '*.txt')
rm -rf "$tmp/deb"
if [ -n "$eval_dir" ]; then
    # every line of >= 60 characters of the evaluation data, as text (JSON
    # lines are searched by their string values' first 60 characters)
    find "$eval_dir" -type f \( -name '*.txt' -o -name '*.jsonl' -o -name '*.json' \) -print0 |
        xargs -0 cat | sed 's/\\n/\n/g; s/","/\n/g; s/": *"/\n/g' | sed 's/^[[:space:]"]*//' |
        awk 'length($0) >= 60 { p = substr($0, 1, 60); if (gsub(/[A-Za-z]+/, "&", p) >= 8) print p }' |
        LC_ALL=C sort -u > "$tmp/patterns"
    LC_ALL=C grep -rlF -f "$tmp/patterns" "$tmp/text" > "$tmp/hits" || true
    {
        echo "$(wc -l < "$tmp/patterns") distinct 60-character prefixes of lines of $eval_dir searched;"
        echo "$(wc -l < "$tmp/hits") corpus files hold at least one (removed):"
        while IFS= read -r f; do
            echo "${f#"$tmp/text/"}: $(LC_ALL=C grep -oF -f "$tmp/patterns" "$f" | head -n 3 | tr '\n' '|' || true)"
        done < "$tmp/hits"
    } > "$tmp/text/OVERLAP.log"
    xargs -r rm -f < "$tmp/hits"
fi
{
    echo "package version files bytes"
    for p in "${pkgs[@]}"; do
        v=$(ls "$cache/${p}"_*.deb | head -n1 | sed 's/.*_\(.*\)_all.deb/\1/')
        echo "$p $v $(find "$tmp/text/$p" -name '*.txt' | wc -l) $(cat "$tmp/text/$p"/*.txt 2>/dev/null | wc -c)"
    done
} > "$tmp/text/SOURCES.tsv"
mv "$tmp/text" "$out"
cat "$out/SOURCES.tsv"
[ -z "$eval_dir" ] || head -n 2 "$out/OVERLAP.log"
