"""Operator variants with workspace: convolution algorithms and attention backends.

Torch-free modules (safe for planners): ``names`` (the ``Variant`` enum), ``capability``
(what each convolution variant computes), ``registry`` (names, workspace, support),
``workspace`` (formulas), ``support`` (refusals), ``meta`` (arg parsing), ``select``
(vDNN / SuperNeurons / moDNN selection), ``speeds`` (measured relative speeds), ``errors``.
Torch modules: ``conv_im2col``, ``conv_fft``, ``attention`` (implementations), ``profile``
(measurement), ``torchmeta`` (tensors to arg_meta). This package imports none of them here.
"""
