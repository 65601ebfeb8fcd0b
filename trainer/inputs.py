"""What a fit reads: batches of the train split (or of a fold's part of it,
or of train + validation), reshuffled every epoch, and of the validation
split, from the preprocessing output's files. The test split is left for
the final evaluation of the export alone."""
import dataclasses
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from schemas import raw
from trainer import data as data_lib
from trainer import settings as settings_lib


@dataclasses.dataclass
class Inputs:
  """What the model is fitted (and, when it is held out, validated) on."""
  train: tf.data.Dataset
  validation: Optional[tf.data.Dataset]
  train_examples: int
  # Train in its own order, unaltered: for the Naive Bayes counts.
  train_once: tf.data.Dataset


def cache_budget(settings: settings_lib.Settings) -> int:
  """The bytes a split may take cached in memory (--cache_memory_share of
  what is available now, at most data.CACHE_MAX_BYTES)."""
  return data_lib.cache_budget(settings.cache_memory_share)


def from_files(settings: settings_lib.Settings,
               data: data_lib.PreprocessedData) -> Inputs:
  """The train and validation splits' batches, read from their files (and
  cached, as --cache says)."""
  budget = cache_budget(settings)
  # Equal-sized batches: a short last batch would make XLA compile the step
  # again; reshuffling drops different examples every epoch.
  train_data = data_lib.dataset(
      data, raw.TRAIN, settings.batch_size, shuffle=True, seed=settings.seed,
      drop_remainder=True, bucket_width=settings.bucket_width,
      cache=data_lib.cache_in_memory(settings.cache, data, (raw.TRAIN,),
                                     budget),
      buffer_size=data_lib.shuffle_buffer(
          data, data.num_examples(raw.TRAIN), budget))
  train_once = data_lib.dataset(data, raw.TRAIN, 1024, cache=False)
  return Inputs(train_data, validation_batches(settings, data, budget),
                data.num_examples(raw.TRAIN), train_once)


def validation_batches(settings: settings_lib.Settings,
                       data: data_lib.PreprocessedData,
                       budget: int) -> tf.data.Dataset:
  # Evaluation needs no small batches; large ones make it several times
  # cheaper per example.
  return data_lib.dataset(
      data, raw.VALIDATION, max(settings.batch_size, 256),
      bucket_width=settings.bucket_width,
      cache=data_lib.cache_in_memory(settings.cache, data,
                                     (raw.VALIDATION,), budget))


def of_rows(settings: settings_lib.Settings, data: data_lib.PreprocessedData,
            splits: Sequence[str], rows: Optional[np.ndarray], cached: bool,
            validation: Optional[tf.data.Dataset] = None) -> Inputs:
  """The ``Inputs`` of the records of ``splits`` at ``rows`` (None: all of
  them), read from their files (a fold's training part, or what a refit
  trains on), kept in memory after the first epoch where ``cached``."""
  count = (sum(data.num_examples(split) for split in splits) if rows is None
           else len(rows))
  return Inputs(
      data_lib.of_rows(
          data, splits, rows, settings.batch_size, shuffle=True,
          seed=settings.seed, cache=cached, drop_remainder=True,
          bucket_width=settings.bucket_width,
          buffer_size=data_lib.shuffle_buffer(data, count,
                                              cache_budget(settings))),
      validation, count, data_lib.of_rows(data, splits, rows, 1024))
