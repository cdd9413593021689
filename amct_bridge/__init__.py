"""amct_bridge: calibrate where you train, write AMCT records, export ESP-DL v1 coefficients.

The core (records, quant, graph, espdl) imports neither TensorFlow nor MindSpore; the
``amct_bridge.keras`` adapter imports TensorFlow/Keras when it is imported itself.

Example:
    >>> import amct_bridge
    >>> amct_bridge.__version__
    '0.1.0'
"""

__version__ = "0.1.0"
