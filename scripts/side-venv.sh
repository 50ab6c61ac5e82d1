# Sourced by the setup scripts of a peer's side of a bench (scripts/setup-bench-trl.sh, setup-tinker-cookbook.sh):
# side_venv VENV REQUIREMENTS [PACKAGE]: VENV with the CPU torch wheel and REQUIREMENTS (not rlkit's lock), then
# PACKAGE without its dependencies when given; idempotent (a stamp of the requirements and PACKAGE).
side_venv() {
  local venv=$1 req=$2 nodeps=${3:-} py=${PYTHON:-python3.11} stamp pip
  command -v "$py" >/dev/null || py=python3
  stamp=$venv/.installed-$( { cat "$req"; if [ -n "$nodeps" ]; then echo "$nodeps"; fi; } | sha256sum | cut -c1-16)
  if [ -f "$stamp" ]; then return 0; fi
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  pip="$venv/bin/pip --disable-pip-version-check -q"
  if [ -n "${PIP_FIND_LINKS:-}" ]; then
    $pip install "torch==2.13.0"
  else
    $pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
  fi
  $pip install -r "$req"
  if [ -n "$nodeps" ]; then $pip install --no-deps "$nodeps"; fi
  rm -f "$venv"/.installed-*
  touch "$stamp"
}
