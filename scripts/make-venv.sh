#!/usr/bin/env bash
# A virtual environment with pip, where the interpreter may lack ensurepip (Ubuntu's python3
# without python3-venv):
#
#   make-venv.sh PYTHON DIR [WHEEL_DIR]
#
# python -m venv when ensurepip is there; otherwise a venv without pip, into which pip is
# installed from the pip wheel in WHEEL_DIR (pip runs from its own wheel file).
set -euo pipefail
python=$1
dir=$2
wheels=${3:-}
if "$python" -c "import ensurepip" 2>/dev/null; then
  exec "$python" -m venv "$dir"
fi
pip_wheel=$(ls "$wheels"/pip-*.whl 2>/dev/null | head -1 || true)
[[ -n $pip_wheel ]] || { echo "make-venv: $python has no ensurepip and no pip wheel was given (WHEEL_DIR=${wheels:-unset})" >&2; exit 1; }
"$python" -m venv --without-pip "$dir"
"$dir/bin/python" "$pip_wheel/pip" install -q --disable-pip-version-check --no-index "$pip_wheel"
