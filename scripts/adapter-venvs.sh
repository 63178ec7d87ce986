#!/bin/sh
# Build the virtual environments the checkpoint-adapter tests run in (tests/capture/test_adapters.py):
#   var/adapters/torchtitan   torch 2.13.0 (CPU) + torchtitan, from requirements/adapters.txt
#   var/adapters/deepspeed    torch 2.13.0 (CPU) + deepspeed
#   var/adapters/megatron     torch 2.13.0 (CPU) + megatron-core (imported as megatron.core)
# torch stays pinned (a constraint file): the frameworks install beside it, never replace it.
# Idempotent: an environment that already imports its framework is left as it is.
set -eu
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
mkdir -p var/adapters
echo "torch==2.13.0" > var/adapters/constraints.txt
# name:distribution:import module
for entry in torchtitan:torchtitan:torchtitan deepspeed:deepspeed:deepspeed megatron:megatron-core:megatron.core; do
    name=${entry%%:*}
    rest=${entry#*:}
    dist=${rest%%:*}
    module=${rest#*:}
    venv="var/adapters/$name"
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import $module" 2>/dev/null; then
        echo "adapter-venvs: $name ready"
        continue
    fi
    "$PYTHON" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "torch==2.13.0" "numpy==2.4.6"
    spec=$(grep "^$dist==" requirements/adapters.txt)
    "$venv/bin/pip" install --quiet --disable-pip-version-check -c var/adapters/constraints.txt --no-build-isolation "$spec"
    echo "adapter-venvs: $name installed ($spec)"
done
