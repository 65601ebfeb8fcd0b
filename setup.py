"""beam-text-classifier: preprocess, train and bulk-score text with Beam + TFT.

Also what Dataflow (or any portable runner) installs on its workers through
``--setup_file ./setup.py``.
"""
import setuptools

# TFT 1.21 pins the TF and Beam it was built against; these are those, so
# a driver and its workers always resolve to the same versions.
REQUIRED = [
    'apache-beam[gcp]==2.77.0',
    'tensorflow==2.21.0',
    'tensorflow-transform==1.21.0',
    'tfx-bsl==1.21.0',
    'pyarrow==25.0.1',
    # The trainer: TensorBoard logs (TF no longer ships TensorBoard) and the
    # report's PNG plots.
    'tensorboard==2.21.0',
    'matplotlib==3.11.2',
]

DASK = ['dask==2026.8.0', 'distributed==2026.8.0']

setuptools.setup(
    name='beam-text-classifier',
    version='0.1.0',
    description='Batch text classification with Apache Beam, '
    'tensorflow-transform and Keras.',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    python_requires='>=3.10,<3.13',
    packages=setuptools.find_packages(include=['pipeline', 'pipeline.*',
                                               'trainer', 'trainer.*',
                                               'schemas', 'schemas.*']),
    install_requires=REQUIRED,
    extras_require={
        # Beam's DaskRunner: the client and every worker of the cluster.
        'dask': DASK,
        'test': ['pytest==9.2.0', 'duckdb==2.0.0'] + DASK,
    },
)
