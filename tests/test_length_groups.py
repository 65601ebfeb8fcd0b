"""The export called in small length-grouped calls: the signature's outputs,
the cut lengths, an export without the token-id signatures."""
from schemas import serving
from serving import exports
from serving import length_groups
from tests.conftest import assert_float32_close
from tests.conftest import synthetic_reviews
from tests.conftest import tiny_export


def test_length_grouped_model_gives_the_signatures_outputs(trained):
  signature, metadata = exports.load(str(trained[0]))
  assert length_groups.supports(signature)
  # Cuts at 4, 5, ..., 20 and max_len 24, and calls of 3 rows on two
  # threads: the tests' documents fall into all of them, and most runs need
  # padding rows.
  grouped = length_groups.LengthGroupedModel(
      signature, metadata.label_names, call_rows=3, shortest=4, threads=2)
  texts = [r['text'] for r in synthetic_reviews(30, 12)] + [
      'great ' * 60,  # longer than max_len
      '', ' <br /><br /> ', 'superb', 'dull film']  # empty after HTML tags
  texts = [' '.join(t.split()[:n]) for n, t in enumerate(texts[:20])] + texts
  for batch in (texts, texts[-6:-5], texts[:1], texts[-3:-2]):
    encoded = [t.encode() for t in batch]
    ours, plain = grouped(text=encoded), signature(text=encoded)
    assert ours[serving.LABEL].tolist() == plain[serving.LABEL].numpy().tolist()
    assert_float32_close(ours[serving.PROBABILITIES],
                         plain[serving.PROBABILITIES].numpy())
    assert_float32_close(ours[serving.CONFIDENCE],
                         plain[serving.CONFIDENCE].numpy())


def test_bucket_lengths():
  assert length_groups.bucket_lengths(200) == [
      64, 80, 96, 112, 128, 160, 192, 200]
  assert length_groups.bucket_lengths(200, shortest=32)[:5] == [
      32, 40, 48, 56, 64]
  assert length_groups.bucket_lengths(1024)[-6:] == [
      448, 512, 640, 768, 896, 1024]
  assert length_groups.bucket_lengths(24, shortest=4) == [
      4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24]
  assert length_groups.bucket_lengths(16) == [16]


def test_an_export_without_the_token_id_signatures_is_served_as_it_is(
    tmp_path):
  folder = tiny_export(tmp_path / 'export', {'label_names': ['neg', 'pos']})
  model, _ = length_groups.load(str(folder))
  assert isinstance(model, length_groups.SignatureModel)
  assert model([b'any'] * 40)[serving.LABEL].tolist() == [b'pos'] * 40
