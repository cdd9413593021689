"""Framework-free quantization math (numpy only): observers, AMCT factors, ARQ, BN folding,
DMQ balancing, shift_bit and ESP-DL power-of-two exponents.

Submodules: ``observers`` (make_observer, BatchStats, batch_stats), ``factors``
(activation_factors, quantize/dequantize/fake_quantize), ``arq``, ``fold``, ``dmq``,
``shift_bit``, ``espdl``. See docs/quantization.md for every formula.

Example:
    >>> from amct_bridge.quant.factors import activation_factors
    >>> activation_factors(0.0, 6.0)[1]
    -128
"""
