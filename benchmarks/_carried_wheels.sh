# Sourced by the device-call scripts: the wheels carried in .whl (Liger-Kernel 0.8.5, say;
# the device has no network) installed into $work/site, put first on PYTHONPATH. Needs $work.
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$work/site" .whl/*.whl || exit 1
    export PYTHONPATH="$work/site:$PYTHONPATH"
fi
