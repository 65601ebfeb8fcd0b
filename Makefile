# make run  - set up .venv, fetch IMDB, run the three jobs end to end with
#            the flags of configs/$(CONFIG) (make run CONFIG=imdb_best)
# make test - set up .venv, run the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The registry files, as CI and tests find them; elsewhere they are downloaded
# into data/cache once.
SHARED_DATASETS := $(abspath ../shared/datasets)
DATASET_CACHE ?= $(if $(wildcard $(SHARED_DATASETS)/SHA256SUMS),$(SHARED_DATASETS),$(abspath data/cache))
DATA := data
# An IMDB configuration under configs/: imdb_seed (a few minutes), imdb_best.
CONFIG ?= imdb_seed
OUT := out

.PHONY: install run test bench bench-train bench-score clean

$(VENV)/.installed: setup.py constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[trainer,test,bench]'
	touch $@

install: $(VENV)/.installed

run: install
	mkdir -p $(DATASET_CACHE)
	$(PY) -m pipeline.datasets fetch imdb --dest $(DATA) --cache $(DATASET_CACHE)
	$(PY) -m pipeline.preprocess --input=$(DATA)/aclImdb \
	    --output_dir=$(OUT)/imdb/preprocessed @configs/$(CONFIG)/preprocess.args
	$(PY) -m trainer.train --data_dir=$(OUT)/imdb/preprocessed \
	    --model_dir=$(OUT)/imdb/model @configs/$(CONFIG)/train.args
	$(PY) -m trainer.predict --model_dir=$(OUT)/imdb/model \
	    "A moving, beautifully acted film." "Two hours I will never get back."
	$(PY) -m pipeline.score --input=$(DATA)/aclImdb/test \
	    --model_dir=$(OUT)/imdb/model --output_dir=$(OUT)/imdb/scores \
	    --partition=dt=$$(date -u +%F)

test: install
	DATASET_CACHE=$(DATASET_CACHE) $(PY) -m pytest tests

bench: install
	DATASET_CACHE=$(DATASET_CACHE) $(PY) bench/preprocess.py

bench-train: install
	DATASET_CACHE=$(DATASET_CACHE) $(PY) bench/train.py

bench-score: install
	DATASET_CACHE=$(DATASET_CACHE) $(PY) bench/score.py

clean:
	rm -rf $(OUT) build dist *.egg-info
