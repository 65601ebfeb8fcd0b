"""Kept fields: their types taken from the input, the values that do not
fit them."""
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import readers
from pipeline.scoring import kept_fields


def test_kept_field_types_come_from_the_input(tmp_path):
  jsonl = tmp_path / 'rows.jsonl'
  jsonl.write_text('{"text": "a", "n": 1, "x": 1.5, "tag": "t"}\n'
                   '{"text": "b", "n": 2, "x": 2, "tag": null}\n')
  config = readers.ReadConfig(format='jsonl', keep_fields=('n', 'x', 'tag'))
  assert kept_fields.schema(readers.resolve_input(str(jsonl), 'jsonl'), config) == pa.schema(
      [('n', pa.int64()), ('x', pa.float64()), ('tag', pa.string())])
  parquet = tmp_path / 'rows.parquet'
  pq.write_table(pa.table({'text': ['a'], 'day': pa.array(
      [1], pa.date32())}), parquet)
  config = readers.ReadConfig(format='parquet', keep_fields=('day',))
  assert kept_fields.schema(readers.resolve_input(str(parquet), 'parquet'),
                            config) == pa.schema(
      [('day', pa.date32())])
  assert kept_fields.misfit({'n': 3}, [('n', pa.int64())]) is None
  assert 'does not fit int64' in kept_fields.misfit({'n': 'three'},
                                                    [('n', pa.int64())])
  with pytest.raises(readers.ReaderError, match='no field'):
    kept_fields.schema(readers.resolve_input(str(parquet), 'parquet'),
                       readers.ReadConfig(format='parquet',
                                          keep_fields=('missing',)))
