"""What a fit reads: batches of the train split, reshuffled every epoch,
and of the validation split, from the preprocessing output's files or from
examples held in memory. The test split is left for the final evaluation
of the export alone."""
import dataclasses
from typing import Optional

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
  what is available now)."""
  return int(settings.cache_memory_share * data_lib.available_memory())


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
      cache=data_lib.cache_in_memory(settings.cache, data, raw.TRAIN, budget),
      buffer_size=data_lib.shuffle_buffer(data, raw.TRAIN, budget))
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
      cache=data_lib.cache_in_memory(settings.cache, data, raw.VALIDATION,
                                     budget))


def in_memory(settings: settings_lib.Settings, examples: data_lib.Examples,
              validation: Optional[tf.data.Dataset]) -> Inputs:
  """The ``Inputs`` of examples held in memory."""
  return Inputs(
      examples.dataset(settings.batch_size, shuffle=True, seed=settings.seed,
                       drop_remainder=True,
                       bucket_width=settings.bucket_width),
      validation, len(examples), examples.dataset(1024))
