"""beam-text-classifier: preprocess, train and bulk-score text with Beam + TFT.

Also what Dataflow (or any portable runner) installs on its workers through
``--setup_file ./setup.py``: the runtime requirements below are what the
Beam jobs need on a worker, nothing more. The exact versions this project
is tested with are in constraints.txt (``pip install -c constraints.txt``).
"""
import setuptools

# TFT 1.21 requires apache-beam[gcp]>=2.53,<3, tensorflow>=2.17,<2.22 and
# tfx-bsl 1.21; the floors here are the versions this code was written
# against.
REQUIRED = [
    'apache-beam[gcp]>=2.77,<3',
    'tensorflow>=2.21,<2.22',
    'tensorflow-transform>=1.21,<1.22',
    'tfx-bsl>=1.21,<1.22',
    'pyarrow>=25',
    # The model is written against the Keras 3 API ("import keras"): TFT
    # makes tf.keras the legacy Keras 2 in any process that imports it.
    'keras>=3',
    # Parses JSONL lines, as json reads them (pipeline.readers.sources).
    'orjson>=3.10',
]

EXTRAS = {
    # The trainer's TensorBoard logs, the report's PNG plots and the n-gram
    # branch's convex solver (scipy): needed where models are trained, not on
    # the workers that preprocess or score.
    'trainer': ['tensorboard>=2.21', 'matplotlib>=3.9', 'scipy>=1.13'],
    # Beam's DaskRunner (pipeline.dask_runner): the client and every worker
    # of the cluster.
    'dask': ['dask>=2026.8', 'distributed>=2026.8'],
    # The benchmarks' TF-IDF baseline (bench/tfidf.py), never the jobs.
    'bench': ['scikit-learn>=1.5'],
}
# moto[server] and boto3: a real S3-compatible server on 127.0.0.1 for the
# object-store tests, through Beam's S3 filesystem. pandas reads the scoring
# output as users do (tfx-bsl already needs it). hypothesis makes up the
# inputs of the reading layer's property tests.
# The documentation site (mkdocs build --strict), never the jobs.
EXTRAS['docs'] = ['mkdocs>=1.6', 'mkdocs-material>=9.5']
EXTRAS['test'] = ['pytest>=9', 'pytest-xdist>=3.6', 'duckdb>=1.1',
                  'pandas>=2', 'moto[server]>=5', 'boto3>=1.34',
                  'hypothesis>=6.100'] + EXTRAS['dask']

setuptools.setup(
    name='beam-text-classifier',
    version='0.1.0',
    description='Batch text classification with Apache Beam, '
    'tensorflow-transform and Keras.',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    python_requires='>=3.10,<3.13',
    packages=setuptools.find_packages(include=[
        f'{package}{sub}' for package in ('schemas', 'cli', 'serving',
                                          'outputs', 'pipeline', 'trainer',
                                          'textclf')
        for sub in ('', '.*')]),
    install_requires=REQUIRED,
    extras_require=EXTRAS,
    # Beside python -m <module>: the commands pip users expect.
    entry_points={'console_scripts': [
        'textclf-preprocess = pipeline.preprocess:main',
        'textclf-train = trainer.train:main',
        'textclf-predict = trainer.predict:main',
        'textclf-score = pipeline.score:main',
        'textclf-datasets = pipeline.datasets:main',
    ]},
)
