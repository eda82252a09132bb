#!/usr/bin/env bash
# Installs the optional system packages that make mlx-nb fast and fully testable on Debian/Ubuntu:
#   libopenblas0-pthread - a fast cblas_sgemm that mlx_nb.runtime preloads before MLX (5-100x matmuls on CPU)
#   chromium             - the headless browser the JupyterLab end-to-end tests drive: only with the
#                          argument `test` (make test); `make lab` installs only what the Lab needs
# Skipped quietly when they are present, when not root, or when there is no apt-get: everything
# still works without them (slower, and the browser test is skipped with its reason).
set -u
want=()
# one path per architecture: present when either exists (a single `ls` of both fails on every machine)
[ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ] || [ -e /usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3 ] \
  || want+=(libopenblas0-pthread)
[ "${1:-lab}" = test ] && ! command -v chromium >/dev/null 2>&1 && want+=(chromium)
[ ${#want[@]} -eq 0 ] && exit 0
if [ "$(uname -s)" != Linux ] || ! command -v apt-get >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "mlx-nb: optional system packages missing (${want[*]}); run 'sudo apt-get install ${want[*]}' for speed and browser tests."
  exit 0
fi
echo "mlx-nb: installing ${want[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null 2>&1 || true
apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null 2>&1 \
  || echo "mlx-nb: could not install ${want[*]}; continuing without them."
exit 0
