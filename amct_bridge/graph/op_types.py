"""TF op types AMCT-TF writes for Keras layer classes (and raw ``keras.ops`` twins).

A table, not code: the Keras adapter looks a node's class name up here to fill ``Node.op_type``.

Example:
    >>> from amct_bridge.graph.op_types import OP_TYPES, ACTIVATION_OP_TYPES
    >>> OP_TYPES["Dense"], OP_TYPES["Conv2DTranspose"], ACTIVATION_OP_TYPES["relu6"]
    ('MatMul', 'Conv2DBackpropInput', 'Relu6')
"""

#: TF op type AMCT-TF writes for a Keras class (raw ops share their layer twin's class name).
OP_TYPES: dict[str, str] = {
    "Conv1D": "Conv2D",
    "Conv2D": "Conv2D",
    "Conv3D": "Conv3D",
    "DepthwiseConv1D": "DepthwiseConv2dNative",
    "DepthwiseConv2D": "DepthwiseConv2dNative",
    "SeparableConv1D": "Conv2D",
    "SeparableConv2D": "Conv2D",
    "Conv1DTranspose": "Conv2DBackpropInput",
    "Conv2DTranspose": "Conv2DBackpropInput",
    "Conv3DTranspose": "Conv3DBackpropInputV2",
    "Dense": "MatMul",
    "BatchNormalization": "FusedBatchNormV3",
    "Add": "AddV2",
    "Subtract": "Sub",
    "Multiply": "Mul",
    "Maximum": "Maximum",
    "Minimum": "Minimum",
    "Average": "AddV2",
    "Concatenate": "ConcatV2",
    "Split": "SplitV",
    "Transpose": "Transpose",
    "Permute": "Transpose",
    "Reshape": "Reshape",
    "Flatten": "Reshape",
    "MaxPooling1D": "MaxPool",
    "MaxPooling2D": "MaxPool",
    "AveragePooling1D": "AvgPool",
    "AveragePooling2D": "AvgPool",
    "GlobalAveragePooling1D": "Mean",
    "GlobalAveragePooling2D": "Mean",
    "GlobalMaxPooling1D": "Max",
    "GlobalMaxPooling2D": "Max",
    "ZeroPadding1D": "Pad",
    "ZeroPadding2D": "Pad",
    "Cropping2D": "StridedSlice",
    "UpSampling2D": "ResizeNearestNeighbor",
    "Dropout": "Identity",
    "SpatialDropout2D": "Identity",
    "GaussianNoise": "Identity",
    "Identity": "Identity",
    "Rescaling": "Mul",
    "Relu": "Relu",
    "Relu6": "Relu6",
    "Sigmoid": "Sigmoid",
    "Silu": "Mul",
    "Tanh": "Tanh",
    "Softmax": "Softmax",
    "LeakyReLU": "LeakyRelu",
    "ELU": "Elu",
    "PReLU": "Prelu",
    "Matmul": "BatchMatMulV2",
    "Dot": "BatchMatMulV2",
}

#: Op type of an Activation layer / fused activation, by activation function name.
ACTIVATION_OP_TYPES: dict[str, str] = {
    "relu": "Relu",
    "relu6": "Relu6",
    "sigmoid": "Sigmoid",
    "hard_sigmoid": "HardSigmoid",
    "tanh": "Tanh",
    "swish": "Mul",
    "silu": "Mul",
    "hard_swish": "Mul",
    "hard_silu": "Mul",
    "elu": "Elu",
    "selu": "Selu",
    "gelu": "Gelu",
    "softmax": "Softmax",
    "linear": "Identity",
    "leaky_relu": "LeakyRelu",
}
