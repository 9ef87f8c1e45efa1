#!/usr/bin/env bash
# Reproduce book/_static/vendor/ from the npm registry (run from the repository root).
#
# The website must render math and widget state with no network (a classroom
# without internet), and `jupyter-book build .` must work on a fresh machine
# without node. So the browser assets are a committed copy, made by this script
# from npm packages pinned here; book/_static/vendor/VERSIONS records what was
# copied. To update: change a version below, run `bash tools/vendor_assets.sh`,
# rebuild, run tests/test_browser.py, commit.
set -euo pipefail

MATHJAX=3.2.2                 # MathJax 3, the tex-chtml component (what Sphinx's mathjax3 support expects)
REQUIREJS=2.3.7               # AMD loader the widget manager's embed-amd.js needs
HTML_MANAGER=1.0.15           # @jupyter-widgets/html-manager 1.x: the embed manager for ipywidgets 8 state

root=$(pwd)
dest=book/_static/vendor
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cd "$tmp"
npm pack --silent "mathjax@$MATHJAX" "requirejs@$REQUIREJS" "@jupyter-widgets/html-manager@$HTML_MANAGER" >/dev/null
for f in *.tgz; do mkdir "${f%.tgz}"; tar xzf "$f" -C "${f%.tgz}"; done
cd "$root"

rm -rf "$dest"
mkdir -p "$dest/mathjax/output/chtml/fonts" "$dest/mathjax/input/tex" "$dest/requirejs" "$dest/html-manager"

# MathJax: the component, its woff fonts, and the TeX extensions it autoloads
# (\boldsymbol, \cancel, ...), which it fetches relative to its own URL.
mj="$tmp/mathjax-$MATHJAX/package"
cp "$mj/es5/tex-chtml.js" "$dest/mathjax/"
cp -r "$mj/es5/output/chtml/fonts/woff-v2" "$dest/mathjax/output/chtml/fonts/"
cp -r "$mj/es5/input/tex/extensions" "$dest/mathjax/input/tex/"
cp "$mj/LICENSE" "$dest/mathjax/LICENSE"

# RequireJS: the package ships no LICENSE file; its header names the MIT licence.
rq="$tmp/requirejs-$REQUIREJS/package"
cp "$rq/require.js" "$dest/requirejs/require.js"
cat > "$dest/requirejs/LICENSE" <<'EOF'
RequireJS is released under the MIT license (header of require.js;
https://github.com/requirejs/requirejs/blob/master/LICENSE):

Copyright jQuery Foundation and other contributors, https://jquery.org/

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in
all copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN
THE SOFTWARE.
EOF

# Widget manager: embed-amd.js (what myst-nb loads after require.js) and the
# Font Awesome files it references by relative URL (woff2/woff only: every
# browser the course supports takes woff2 first). The package ships no LICENSE
# file; it is the ipywidgets repository's BSD-3-Clause licence, plus the
# third-party notices webpack collected.
hm="$tmp/jupyter-widgets-html-manager-$HTML_MANAGER/package/dist"
cp "$hm/embed-amd.js" "$dest/html-manager/"
cp "$hm"/*.woff2 "$hm"/*.woff "$dest/html-manager/"
cp "$hm/embed.js.LICENSE.txt" "$dest/html-manager/THIRD-PARTY-NOTICES.txt"
python - "$dest/html-manager/LICENSE" <<'EOF'
import sys
from importlib.metadata import distribution
# The ipywidgets Python distribution carries the repository's licence text.
lic = next(f for f in distribution("ipywidgets").files if f.name == "LICENSE")
open(sys.argv[1], "w").write(
    "@jupyter-widgets/html-manager is part of the ipywidgets repository\n"
    "(https://github.com/jupyter-widgets/ipywidgets), BSD-3-Clause:\n\n" + lic.read_text())
EOF

cat > "$dest/VERSIONS" <<EOF
# Browser assets served by the website itself (no CDN). Made by tools/vendor_assets.sh
# from the npm registry; do not edit by hand.
# name                           version        licence        files copied
mathjax                          $MATHJAX          Apache-2.0     es5/tex-chtml.js, es5/output/chtml/fonts/woff-v2/, es5/input/tex/extensions/
requirejs                        $REQUIREJS          MIT            require.js
@jupyter-widgets/html-manager    $HTML_MANAGER         BSD-3-Clause   dist/embed-amd.js, dist/*.woff2, dist/*.woff
EOF
du -sh "$dest"
