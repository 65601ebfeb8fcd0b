"""The transformer trained on what the n-gram branch gets wrong, in the
trainer's grouped cross-validation: does it earn more of the mix than the
transformer trained alone?

The n-gram branch fits its own training reviews to 97-99 %, so its
training-set logits say little about its mistakes on new reviews. Its
held-out logits do: the n-gram branch is cross-validated first (the
trainer's folds, the configuration's count and epochs), and every training
review gets the logits of the fold model that did not see it. The stacked
transformer is then trained, in the same folds, to add its logits to those
(softmax(n-gram + transformer), the n-gram part fixed), and is read on its
held-out fold as that sum (and as the sum with its part scaled by the
best of the same weights). The transformer trained alone, in the same
folds and the same way, is read as the best convex mix with the n-gram
branch (weights in 5 % steps, as the trainer fits them), which flatters it.
Nothing here reads the test split.

    python bench/stacked_transformer.py --data_dir=PREPROCESSED \\
        [--config=imdb_best] [--ngram_min_count=16] [--folds=3] [--seed=42]

(16: the count imdb_best's cross-validation chooses.)

A stacked fold's n-gram logits for its training reviews came from models
that saw its held-out fold: the leak favours the stacked transformer.
"""
import dataclasses
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import argument_parser  # pylint: disable=wrong-import-position
from common import machine  # pylint: disable=wrong-import-position
from common import split_arrays  # pylint: disable=wrong-import-position

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Convex weights of the transformer tried for the plain mix.
_MIX_STEPS = np.linspace(0, 1, 21)


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
  from trainer import selection  # pylint: disable=import-outside-toplevel
  return round(selection.accuracy(logits, labels), 4)


def transformer_held_out(settings, data, token_ids, labels, fold_of,
                         folds: int, offsets) -> list:
  """Every example's transformer logits from the fold model that did not
  see it, after each epoch; trained on softmax(logits + offsets) when
  ``offsets`` are given, on softmax(logits) when None."""
  import keras  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from trainer import branch_fit  # pylint: disable=import-outside-toplevel
  from trainer import model as model_lib  # pylint: disable=import-outside-toplevel
  params = settings.params
  schedule = settings.schedule(model_lib.TRANSFORMER_LOGITS)
  classes = len(data.label_names)
  width = min(data.max_len, params.transformer_len or data.max_len)
  token_ids = token_ids[:, :width]
  offsets = (np.zeros((len(labels), classes), np.float32)
             if offsets is None else offsets)
  by_epoch = [np.zeros((len(labels), classes), np.float32)
              for _ in range(schedule.epochs)]
  for fold in range(folds):
    fitted, held = np.flatnonzero(fold_of != fold), fold_of == fold
    whole = model_lib.build_model(
        data.vocab_size, data.max_len, classes,
        dataclasses.replace(params, model='transformer'))
    branch = keras.Model(whole.inputs,
                         whole.get_layer(model_lib.TRANSFORMER_LOGITS).output)
    ids = keras.Input(shape=(None,), dtype='int64')
    offset = keras.Input(shape=(classes,), dtype='float32')
    stacked = keras.Model([ids, offset], keras.layers.Activation('softmax')(
        keras.layers.Add()([branch(ids), offset])))
    steps = len(fitted) // settings.batch_size * schedule.epochs
    stacked.compile(optimizer=branch_fit.optimizer(schedule, steps),
                    loss=keras.losses.SparseCategoricalCrossentropy(),
                    jit_compile=True)
    batches = tf.data.Dataset.from_tensor_slices(
        ((token_ids[fitted], offsets[fitted]), labels[fitted])
    ).shuffle(len(fitted), seed=settings.seed).batch(settings.batch_size,
                                                    drop_remainder=True)
    for epoch in range(schedule.epochs):
      stacked.fit(batches, epochs=1, shuffle=False, verbose=0)
      by_epoch[epoch][held] = branch.predict(token_ids[held], batch_size=256,
                                             verbose=0)
  return by_epoch


def compare(data_dir: str, config: str, min_count: int, folds: int,
            seed: int, flags=()) -> dict:
  """The n-gram branch, the transformer alone mixed with it, and the
  stacked transformer, each read on the same held-out folds; ``flags``
  after the configuration's training flags."""
  import keras  # pylint: disable=import-outside-toplevel
  from schemas import raw  # pylint: disable=import-outside-toplevel
  from schemas import transformed  # pylint: disable=import-outside-toplevel
  from trainer import folds as folds_lib  # pylint: disable=import-outside-toplevel
  from trainer import ngram_fit  # pylint: disable=import-outside-toplevel
  from trainer import runs  # pylint: disable=import-outside-toplevel
  from trainer import settings as settings_lib  # pylint: disable=import-outside-toplevel
  from trainer import train  # pylint: disable=import-outside-toplevel
  scratch = tempfile.mkdtemp(prefix='bench-stacked-')
  settings, data = settings_lib.settings_from_args(train.parse_args([
      f'--data_dir={data_dir}', f'--model_dir={scratch}',
      f'@{os.path.join(_REPO, "configs", config, "train.args")}',
      f'--seed={seed}', f'--ngram_min_count={min_count}',
      f'--folds={folds}', *flags]))
  params = settings.params
  keras.utils.set_random_seed(seed)
  planned = folds_lib.plan(settings, data)
  fold_of, labels = planned.fold_of, planned.labels
  token_ids, = split_arrays(data, (raw.TRAIN,), (transformed.TOKEN_IDS,))
  started = time.time()
  # The trainer's own cross-validation of the n-gram branch alone: its
  # held-out logits at the best epoch, in the same folds.
  ngram = folds_lib.cross_validate(
      settings, dataclasses.replace(params, model='nbsvm'), data, planned,
      ngram_fit.fold_table(settings, data, (raw.TRAIN,)),
      runs.Run(scratch)).logits[:, 0]
  result = {'folds': folds, 'examples': len(labels),
            'ngram_min_count': params.ngram_min_count,
            'ngram': accuracy(ngram, labels),
            'ngram_s': round(time.time() - started)}
  for kind in ('alone', 'stacked'):
    started = time.time()
    by_epoch = transformer_held_out(settings, data, token_ids, labels,
                                    fold_of, folds, ngram if kind ==
                                    'stacked' else None)
    if kind == 'alone':
      result['alone'] = [{
          'transformer': accuracy(logits, labels),
          'best_mix': max((accuracy((1 - share) * ngram + share * logits,
                                    labels), round(float(share), 2))
                          for share in _MIX_STEPS)}
                         for logits in by_epoch]
    else:
      result['stacked'] = [{
          'sum': accuracy(ngram + logits, labels),
          'best_scaled': max((accuracy(ngram + share * logits, labels),
                              round(float(share), 2))
                             for share in _MIX_STEPS)}
                           for logits in by_epoch]
    result[f'{kind}_s'] = round(time.time() - started)
  return result


def main():
  parser = argument_parser(__doc__.split('\n\n')[0])
  parser.add_argument('--data_dir', required=True,
                      help='A preprocessing output made with --config\'s '
                      'preprocess.args.')
  parser.add_argument('--config', default='imdb_best')
  parser.add_argument('--ngram_min_count', type=int, default=16)
  parser.add_argument('--folds', type=int, default=3)
  parser.add_argument('--seed', type=int, default=42)
  args = parser.parse_args()
  print(f'machine: {machine()}', flush=True)
  print(json.dumps(compare(args.data_dir, args.config, args.ngram_min_count,
                           args.folds, args.seed)), flush=True)


if __name__ == '__main__':
  main()
