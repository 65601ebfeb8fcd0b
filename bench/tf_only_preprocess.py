"""Baseline for bench/preprocess.py: the same preprocessing, TensorFlow only.

Reads an aclImdb tree or a JSONL file (``text``, ``label`` and ``split``
fields) in one process, learns the vocabulary on the train
split with Keras ``TextVectorization.adapt`` (standardized by our own
``pipeline.transform.normalize``), vectorizes and pads both splits, and
writes them as gzip TFRecords. No Beam, no TFT.

    python bench/tf_only_preprocess.py --input=DIR --output_dir=DIR
"""
import argparse
import json
import os
import posixpath

import tensorflow as tf

from pipeline import transform
from schemas import raw


def read_tree(root):
  """(texts, labels) per split of an aclImdb-style tree."""
  splits = {}
  for path in sorted(tf.io.gfile.glob(posixpath.join(root, '*', '*', '*'))):
    label = posixpath.basename(posixpath.dirname(path))
    split = raw.SPLIT_ALIASES[posixpath.basename(posixpath.dirname(
        posixpath.dirname(path)))]
    with tf.io.gfile.GFile(path, 'rb') as handle:
      texts, labels = splits.setdefault(split, ([], []))
      texts.append(handle.read())
      labels.append(label)
  return splits


def read_jsonl(path):
  """(texts, labels) per split of a JSONL file."""
  splits = {}
  with tf.io.gfile.GFile(path, 'rb') as handle:
    for line in handle:
      record = json.loads(line)
      texts, labels = splits.setdefault(
          raw.SPLIT_ALIASES[record[raw.SPLIT]], ([], []))
      texts.append(record[raw.TEXT].encode('utf-8'))
      labels.append(record[raw.LABEL])
  return splits


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--input', required=True)
  parser.add_argument('--output_dir', required=True)
  parser.add_argument('--vocab_size', type=int, default=20000)
  parser.add_argument('--max_len', type=int, default=200)
  args = parser.parse_args()
  splits = (read_jsonl(args.input) if args.input.endswith('.jsonl')
            else read_tree(args.input))
  train_texts, train_labels = splits[raw.TRAIN]
  # TextVectorization calls standardize on a batch; split on whitespace
  # matches our tokenizer, and it reserves 0 for padding and 1 for OOV too.
  vectorizer = tf.keras.layers.TextVectorization(
      max_tokens=args.vocab_size, standardize=transform.normalize,
      split='whitespace', output_sequence_length=args.max_len)
  vectorizer.adapt(tf.data.Dataset.from_tensor_slices(train_texts).batch(1000))
  label_names = sorted(set(train_labels))
  os.makedirs(args.output_dir, exist_ok=True)
  options = tf.io.TFRecordOptions(compression_type='GZIP')
  for split, (texts, labels) in splits.items():
    path = posixpath.join(args.output_dir, f'{split}.tfrecord.gz')
    dataset = tf.data.Dataset.from_tensor_slices((texts, labels)).batch(1000)
    with tf.io.TFRecordWriter(path, options) as writer:
      for text_batch, label_batch in dataset:
        ids = vectorizer(text_batch).numpy()
        lengths = tf.strings.split(transform.normalize(text_batch)
                                   ).row_lengths().numpy()
        for row, length, label in zip(ids, lengths, label_batch.numpy()):
          example = tf.train.Example(features=tf.train.Features(feature={
              'token_ids': tf.train.Feature(
                  int64_list=tf.train.Int64List(value=row)),
              'length': tf.train.Feature(
                  int64_list=tf.train.Int64List(value=[length])),
              'label_id': tf.train.Feature(int64_list=tf.train.Int64List(
                  value=[label_names.index(label.decode())])),
          }))
          writer.write(example.SerializeToString())
  print(f'vocabulary {vectorizer.vocabulary_size()}, wrote {args.output_dir}')


if __name__ == '__main__':
  main()
