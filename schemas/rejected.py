"""Dead letters: one JSON object a line under ``_rejected/``, in every job."""
from schemas import raw

ID = raw.ID
SOURCE = raw.SOURCE
REASON = raw.REASON
SNIPPET = raw.SNIPPET
FIELDS = (ID, SOURCE, REASON, SNIPPET)
# The folder of dead letters inside every job's output: named with a leading
# ``_`` so that dataset readers (pyarrow, pandas, Spark, Hive) skip it.
DIR = '_rejected'
# Its files: rejected-SSSSS-of-NNNNN.jsonl.
FILE_PREFIX = 'rejected'
FILE_SUFFIX = '.jsonl'
FILE_PATTERN = f'{DIR}/{FILE_PREFIX}-*{FILE_SUFFIX}'

SNIPPET_CHARS = 500  # enough of a raw record to recognise it, never the whole

# Why a record was rejected. Stats, counters and dead letters use these names.
MALFORMED_RECORD = 'malformed_record'    # unparseable JSON/CSV/Example
WRONG_TYPE = 'wrong_type'                # a field of the wrong type
MISSING_TEXT = 'missing_text'            # the text field is absent
EMPTY_TEXT = 'empty_text'                # nothing but whitespace, tags, zero-width
TEXT_TOO_LONG = 'text_too_long'          # over --max_text_bytes
UNDECODABLE_TEXT = 'undecodable_text'    # bytes invalid in --encoding
MISSING_LABEL = 'missing_label'          # absent or empty label
# A label with control characters (newline, tab, NUL...), line separators or
# surrounding whitespace: TFT's newline-delimited vocabulary file would lose
# it, and its examples would carry no class.
BAD_LABEL = 'bad_label'
UNKNOWN_SPLIT = 'unknown_split'          # a split value we cannot map
MISSING_SPLIT = 'missing_split'          # --split_field given, value absent
LABEL_NOT_IN_TRAIN = 'label_not_in_train'  # eval label the model cannot know
INFERENCE_FAILED = 'inference_failed'    # the model raised on its batch
# Reasons that are about a record's label, not its text: their dead letters'
# snippets show the label, escaped, before the text.
ABOUT_THE_LABEL = (MISSING_LABEL, BAD_LABEL, LABEL_NOT_IN_TRAIN)
# A file that cannot be read to its end (a truncated or corrupt compressed
# stream, an unreadable Parquet footer or row group, TFRecord framing that
# cannot be resynchronised): one dead letter covers all that is lost, its id
# the file and the position where the loss begins, its snippet the byte
# offset and the error. Records read before the fault are kept.
CORRUPT_FILE = 'corrupt_file'
# A matched path that cannot be read at all: a file that cannot be opened
# (permissions) or fails while read, a dangling symbolic link, a FIFO, a
# socket or device, a folder. One dead letter a path, its id and source the
# path, its snippet what is wrong.
UNREADABLE_FILE = 'unreadable_file'
