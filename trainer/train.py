"""The trainer: a text classifier from the preprocessing job's TFRecords.

    python -m trainer.train --data_dir=PREPROCESS_OUTPUT --model_dir=DIR
        [--epochs=N] [--batch_size=32] [--learning_rate=1e-3] [--[no-]decay]
        [--embed_dim=32] [--num_heads=2] [--key_dim=0] [--ff_dim=32]
        [--num_layers=1] [--dropout=0.1] [--pooling=mean|max]
        [--positions=learned|sinusoidal] [--model=transformer|nbsvm|hybrid]
        [--seed=42] ... [@configs/NAME/train.args]

Vocabulary size, number of classes and sequence length come from the
preprocessing output. The defaults are the hybrid: an NBSVM n-gram branch
beside the keras.io transformer. Trains with Adam(W) and sparse categorical
cross-entropy (the hybrid's two branches one after the other) on the train
split; what is chosen (each branch's epochs, the n-gram branch's minimum
document count, the temperature and the hybrid's branch weights) is chosen
by grouped cross-validation over the train split or on the validation
split, as --folds says; the most epochs from the size of the train split.
Saves a raw-text SavedModel, staged, evaluates that export on validation
and, once, on test, judges whether it is blessed (``trainer.blessing``:
served by jobs that name the model folder) and only then publishes it as a
version, with metrics.json and a report with plots. One trainer at a time
in a model folder (``trainer.lock``); a run that fails or is killed leaves
the previous one's files as they were (``trainer.runs``).

``run`` is the recipe; each step is a module of its own: the flags
(``trainer.flags``) and what they resolve to on the data
(``trainer.settings``), the folds (``trainer.folds``), the fit
(``trainer.fitting``, one branch in ``trainer.branch_fit``, the n-gram
branch's counts in ``trainer.ngram_fit``, what it reads in
``trainer.inputs``), the export's evaluation (``trainer.evaluate``), its
blessing (``trainer.blessing``) and publishing (``trainer.publishing``).
"""
# First, before TensorFlow loads: no CUDA noise on a machine without a GPU.
from cli import quiet  # pylint: disable=unused-import,g-bad-import-order
import time

import cli
from cli import flags
from trainer import blessing as blessing_lib
from trainer import evaluate
from trainer import fitting
from trainer import flags as trainer_flags
from trainer import folds
from trainer import publishing
from trainer import settings as settings_lib


def build_parser() -> flags.Parser:
  """The trainer's flags (``trainer.flags``), each typed and range-checked;
  @FILE reads flags from a file, one a line (configs/<name>/)."""
  parser = flags.Parser(__doc__.split('\n\n')[0], module='trainer.train')
  trainer_flags.add_flags(parser)
  return parser


def parse_args(argv):
  return flags.parse(build_parser(), argv)[0]


def run(argv=None):
  """The training job: the flags resolved on the data once, the folds
  dealt, the model fitted, its export saved, evaluated, judged and only
  then published; returns (metrics, the export's folder), or raises
  ``blessing.NotBlessed`` once a version the gate did not bless is
  published."""
  args = parse_args(argv)
  started = time.time()
  settings, data = settings_lib.settings_from_args(args)
  # Before the model folder is touched: a plan that cannot be carried out
  # leaves nothing behind.
  settings, planned = folds.plan_or_validation(
      settings, data, auto=args.folds is None and args.refit is None)
  with publishing.claimed(settings.model_dir, data) as run_folders:
    trained = fitting.fit(settings, data, run_folders, planned)
    publishing.save(trained, settings, data, run_folders)
    evaluation = evaluate.evaluate(run_folders.export, data)
    blessing = blessing_lib.judge(run_folders.export, evaluation, settings,
                                  data)
    export_dir = publishing.publish(evaluation, data, run_folders)
    publishing.log_summary(trained, evaluation, export_dir,
                           settings.model_dir, started)
  # Published either way, to be inspected and served by name; a nightly
  # retrain that jobs will not serve must not end as if it were.
  blessing_lib.check(blessing, export_dir, settings.model_dir)
  return evaluation.metrics, export_dir


def main():
  """The console script's entry point."""
  cli.main(run)


if __name__ == '__main__':
  main()
