"""The stacked-transformer bench: every training example read once held
out, by each model, after every epoch."""
from bench import stacked_transformer
from schemas import raw
from trainer import data as data_lib


def test_each_model_reads_every_held_out_fold_after_every_epoch(
    synthetic_preprocessed):
  result = stacked_transformer.compare(
      str(synthetic_preprocessed), 'imdb_best', min_count=2, folds=2, seed=0,
      flags=['--embed_dim=8', '--ff_dim=8', '--epochs=2', '--ngram_epochs=2',
             '--transformer_vocab=0', '--transformer_len=0'])
  data = data_lib.PreprocessedData.load(str(synthetic_preprocessed))
  assert result['examples'] == data.num_examples(raw.TRAIN)
  assert len(result['alone']) == len(result['stacked']) == 2
  # The synthetic reviews' cue words give the label away: a fold model that
  # left an example unread (zero logits) would fall far short.
  assert result['ngram'] > 0.9
  # The transformer of this tiny model learns little in two epochs: what
  # is checked of it is that each epoch was read, and the mix on the grid.
  assert all(0 <= epoch['sum'] <= 1 for epoch in result['stacked'])
  assert all(abs(epoch['best_mix'][1] * 20 - round(epoch['best_mix'][1] * 20))
             < 1e-6 for epoch in result['alone'])
