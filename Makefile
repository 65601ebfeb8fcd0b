# make run  - set up .venv, fetch IMDB, run the three jobs end to end with
#            their defaults, or the flags of configs/$(CONFIG)
#            (make run CONFIG=imdb_seed)
# make test - set up .venv, run the test suite
# make test-airflow - set up .venv and .venv-airflow, run the example DAG
#            under Airflow (examples/airflow)
# make docs - set up .venv, build the documentation site into site/
# make test-runners - set up .venv, fetch the Flink, Spark and Prism runners
#            (cached in ~/.cache/beam-text-classifier), run both jobs on each
#            against the default runner
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The registry files, as CI and tests find them; elsewhere they are downloaded
# into data/cache once.
SHARED_DATASETS := $(abspath ../shared/datasets)
DATASET_CACHE ?= $(if $(wildcard $(SHARED_DATASETS)/SHA256SUMS),$(SHARED_DATASETS),$(abspath data/cache))
DATA := data
# An IMDB configuration under configs/: imdb_seed (the keras.io model, a few
# minutes), imdb_best; none: the jobs' defaults.
CONFIG ?=
CONFIG_ARGS = $(if $(CONFIG),@configs/$(CONFIG)/$(1).args)
# IMDB's validation is held out by group, a label folder's block of 100 file
# ids (pipeline.datasets.IMDB_GROUP_PATTERN): never in configs/, which hold
# no corpus's split policy.
IMDB_GROUP_PATTERN := /((?:pos|neg)/)(?:(\d+)\d\d|\d{1,2})_\d+\.txt
OUT := out
# Airflow in an environment of its own, so that its pins never touch the
# jobs'; examples/airflow/constraints.txt pins apache-airflow 3.3.2.
AIRFLOW_VENV := .venv-airflow
AIRFLOW_PY := $(AIRFLOW_VENV)/bin/python
AIRFLOW_CONSTRAINTS := examples/airflow/constraints.txt

.PHONY: install run test test-runners test-airflow docs bench bench-train bench-score clean

# uv (from PyPI, through pip) installs the same pinned set as pip in about
# a third of the time: it downloads in parallel and byte-compiles on every
# core. Where it cannot be had, or fails, pip installs the set instead.
EXTRAS := trainer,test,bench,docs
$(VENV)/.installed: setup.py constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	{ $(PY) -m pip install --quiet -c constraints.txt uv && \
	  $(VENV)/bin/uv pip install --quiet --python $(PY) --compile-bytecode \
	      -c constraints.txt -e '.[$(EXTRAS)]'; } || \
	  $(PY) -m pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	touch $@

install: $(VENV)/.installed

run: install
	mkdir -p $(DATASET_CACHE)
	$(PY) -m pipeline.datasets fetch imdb --dest $(DATA) --cache $(DATASET_CACHE)
	$(PY) -m pipeline.preprocess --input=$(DATA)/aclImdb \
	    --output_dir=$(OUT)/imdb/preprocessed $(call CONFIG_ARGS,preprocess) \
	    '--group_pattern=$(IMDB_GROUP_PATTERN)'
	$(PY) -m trainer.train --data_dir=$(OUT)/imdb/preprocessed \
	    --model_dir=$(OUT)/imdb/model $(call CONFIG_ARGS,train)
	$(PY) -m trainer.predict --model_dir=$(OUT)/imdb/model \
	    "A moving, beautifully acted film." "Two hours I will never get back."
	$(PY) -m pipeline.score --input=$(DATA)/aclImdb/test \
	    --model_dir=$(OUT)/imdb/model --output_dir=$(OUT)/imdb/scores \
	    --partition=dt=$$(date -u +%F)

# Three workers on the two cores CI has: a third fills the time the other
# two spend waiting on subprocesses and pipelines. Test files are handed out
# longest first (tests/conftest.py), not by xdist's count of their tests.
# The runners tests keep pytest.ini's two: their clusters take the cores and
# the memory.
test: install
	DATASET_CACHE=$(DATASET_CACHE) $(PY) -m pytest tests -m 'not runners' -n 3 --no-loadscope-reorder

test-runners: install
	$(PY) -m clusters fetch all
	DATASET_CACHE=$(DATASET_CACHE) $(PY) -m pytest tests -m runners

# The documentation site, --strict: a broken link, a missing page, a
# generated part of a page that is not the code's, or a site that would not
# work opened from disk fails it. Mermaid and a search shim come from npm
# (docs/hooks.py). Open site/index.html.
docs: install
	$(PY) docs/hooks.py fetch
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

$(AIRFLOW_VENV)/.installed: $(AIRFLOW_CONSTRAINTS)
	test -x $(AIRFLOW_PY) || $(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_PY) -m pip install --quiet --upgrade pip
	$(AIRFLOW_PY) -m pip install --quiet -c $(AIRFLOW_CONSTRAINTS) apache-airflow pytest
	touch $@

test-airflow: install $(AIRFLOW_VENV)/.installed
	PROJECT_PYTHON=$(abspath $(PY)) $(AIRFLOW_PY) -m pytest examples/airflow

bench: install
	DATASET_CACHE=$(DATASET_CACHE) $(PY) bench/preprocess.py

bench-train: install
	DATASET_CACHE=$(DATASET_CACHE) $(PY) bench/train.py

bench-score: install
	DATASET_CACHE=$(DATASET_CACHE) $(PY) bench/score.py

clean:
	rm -rf $(OUT) build dist site *.egg-info
