#include "designer/kerasscript.h"

#include <cctype>
#include <cmath>
#include <set>
#include <sstream>

namespace ts {

using nlohmann::json;

namespace {

const std::set<std::string>& reservedNames()
{
    // Python keywords and the names the script itself uses.
    static const std::set<std::string> names = {
        "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
        "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global",
        "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise",
        "return", "try", "while", "with", "yield", "match", "case",
        "tf", "np", "keras", "layers", "os", "gzip", "argparse", "sys", "model"};
    return names;
}

std::string quoted(const std::string& s)
{
    return json(s).dump();  // a JSON string is a valid Python string literal
}

// A JSON value as a Python literal: lists become tuples where Keras expects tuples.
std::string literal(const json& v, bool tuple = false)
{
    if (v.is_null())
        return "None";
    if (v.is_boolean())
        return v.get<bool>() ? "True" : "False";
    if (v.is_number_integer())
        return std::to_string(v.get<int64_t>());
    if (v.is_number()) {
        std::string s = v.dump();
        if (s.find_first_of(".eE") == std::string::npos)
            s += ".0";
        return s;
    }
    if (v.is_string())
        return quoted(v.get<std::string>());
    if (v.is_array()) {
        std::string s = tuple ? "(" : "[";
        for (std::size_t i = 0; i < v.size(); ++i)
            s += (i ? ", " : "") + literal(v[i], tuple);
        if (tuple && v.size() == 1)
            s += ",";
        return s + (tuple ? ")" : "]");
    }
    std::string s = "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
        s += (first ? "" : ", ") + quoted(it.key()) + ": " + literal(it.value());
        first = false;
    }
    return s + "}";
}

std::string activation(const json& a)
{
    const std::string name = a.is_string() ? a.get<std::string>() : std::string("linear");
    if (name == "leaky_relu")
        return "_activation(\"leaky_relu\")";
    return quoted(name);
}

// The constructor call of one layer, without the call on its inputs.
// `float32`: the layer is pinned to float32 (attrs dtype), whatever the global policy.
Result<std::string> layerCall(const NodeInfo& n, bool float32)
{
    const json& a = n.attrs;
    const std::string& t = n.type;
    const std::string name = "name=" + quoted(n.id) + (float32 ? ", dtype=\"float32\"" : "");
    if (t == "Dense")
        return "layers.Dense(" + literal(a["units"]) + ", activation=" + activation(a["activation"])
               + ", use_bias=" + literal(a["use_bias"]) + ", " + name + ")";
    if (t == "Conv2D")
        return "layers.Conv2D(" + literal(a["filters"]) + ", kernel_size=" + literal(a["kernel_size"], true)
               + ", strides=" + literal(a["strides"], true) + ", padding=" + literal(a["padding"])
               + ", activation=" + activation(a["activation"]) + ", use_bias=" + literal(a["use_bias"])
               + ", " + name + ")";
    if (t == "MaxPooling2D" || t == "AveragePooling2D")
        return "layers." + t + "(pool_size=" + literal(a["pool_size"], true) + ", strides="
               + literal(a["strides"], true) + ", padding=" + literal(a["padding"]) + ", " + name + ")";
    if (t == "GlobalAveragePooling2D" || t == "Flatten" || t == "ReLU" || t == "Add")
        return "layers." + t + "(" + name + ")";
    if (t == "Reshape")
        return "layers.Reshape(target_shape=" + literal(a["target_shape"], true) + ", " + name + ")";
    if (t == "Dropout")
        return "layers.Dropout(" + literal(a["rate"]) + ", " + name + ")";
    if (t == "BatchNormalization")
        return "layers.BatchNormalization(axis=-1, momentum=" + literal(a["momentum"]) + ", epsilon="
               + literal(a["epsilon"]) + ", center=" + literal(a["center"]) + ", scale="
               + literal(a["scale"]) + ", " + name + ")";
    if (t == "Activation")
        return "layers.Activation(" + activation(a["activation"]) + ", " + name + ")";
    if (t == "LeakyReLU")
        return "layers.LeakyReLU(**{_LEAKY_SLOPE: " + literal(a["alpha"]) + "}, " + name + ")";
    if (t == "Softmax" || t == "Concatenate")
        return "layers." + t + "(axis=-1, " + name + ")";
    return makeError(ErrorCode::Unsupported, "node '" + n.id + "': no Keras script form for layer type " + t,
                     "report this as a TrainStudio bug");
}

std::string optimizerClass(const std::string& type)
{
    if (type == "adamw") return "AdamW";
    if (type == "sgd") return "SGD";
    if (type == "rmsprop") return "RMSprop";
    return "Adam";
}

std::string lossExpression(const CompileSpec& c)
{
    const std::string logits = std::string("from_logits=") + (c.fromLogits ? "True" : "False");
    if (c.loss == "categorical_crossentropy")
        return "keras.losses.CategoricalCrossentropy(" + logits + ")";
    if (c.loss == "binary_crossentropy")
        return "keras.losses.BinaryCrossentropy(" + logits + ")";
    if (c.loss == "mean_squared_error" || c.loss == "mse")
        return "keras.losses.MeanSquaredError()";
    return "keras.losses.SparseCategoricalCrossentropy(" + logits + ")";
}

} // namespace

std::string pythonIdentifier(const std::string& id)
{
    std::string s;
    for (char c : id)
        s += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
    if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0])))
        s = "layer_" + s;
    if (reservedNames().count(s))
        s += "_";
    return s;
}

Result<std::string> kerasScript(const ModelSpec& spec)
{
    const GraphAnalysis a = analyzeModel(spec);
    TS_TRY(problemsToStatus(a, "model '" + spec.name + "'"));

    // Variable names: unique Python identifiers.
    std::vector<std::string> vars(a.nodes.size());
    std::set<std::string> used;
    for (std::size_t i = 0; i < a.nodes.size(); ++i) {
        std::string v = pythonIdentifier(a.nodes[i].id);
        const std::string base = v;
        for (int k = 2; used.count(v); ++k)
            v = base + "_" + std::to_string(k);
        used.insert(v);
        vars[i] = v;
    }

    const bool mixed = spec.compile.precision != PrecisionPolicy::Float32;
    std::ostringstream body;
    for (std::size_t i = 0; i < a.nodes.size(); ++i) {
        const NodeInfo& n = a.nodes[i];
        if (n.type == "Input") {
            body << "    " << vars[i] << " = keras.Input(shape=" << literal(n.attrs["shape"], true)
                 << ", name=" << quoted(n.id) << ")\n";
            continue;
        }
        // Pinned layers say so even in a float32 model: the pin survives a global mixed policy
        // set in the script later.
        const bool pinned = n.attrs.value("dtype", std::string("policy")) == "float32";
        TS_ASSIGN(std::string call, layerCall(n, pinned));
        std::string args;
        if (n.inputs.size() == 1 && n.type != "Add" && n.type != "Concatenate") {
            args = vars[static_cast<std::size_t>(n.inputs[0])];
        } else {
            args = "[";
            for (std::size_t k = 0; k < n.inputs.size(); ++k)
                args += (k ? ", " : "") + vars[static_cast<std::size_t>(n.inputs[k])];
            args += "]";
        }
        body << "    " << vars[i] << " = " << call << "(" << args << ")\n";
    }
    auto list = [&](const std::vector<int>& idx) {
        if (idx.size() == 1)
            return vars[static_cast<std::size_t>(idx[0])];
        std::string s = "[";
        for (std::size_t k = 0; k < idx.size(); ++k)
            s += (k ? ", " : "") + vars[static_cast<std::size_t>(idx[k])];
        return s + "]";
    };
    body << "    return keras.Model(inputs=" << list(a.inputNodes) << ", outputs=" << list(a.outputNodes)
         << ", name=" << quoted(spec.name) << ")\n";

    // Optimizer: the type picks the class, the other keys are its Keras arguments.
    const json& o = spec.compile.optimizer;
    const std::string type = o.is_object() ? o.value("type", std::string("adam"))
                             : o.is_string() ? o.get<std::string>() : std::string("adam");
    std::string optArgs;
    if (o.is_object())
        for (auto it = o.begin(); it != o.end(); ++it)
            if (it.key() != "type")
                optArgs += (optArgs.empty() ? "" : ", ") + it.key() + "=" + literal(it.value());
    json metrics = spec.compile.metrics;

    std::string inputShapes = "[";
    for (std::size_t k = 0; k < a.inputNodes.size(); ++k)
        inputShapes += (k ? ", " : "") + literal(a.nodes[static_cast<std::size_t>(a.inputNodes[k])].attrs["shape"], true);
    inputShapes += "]";

    // The model's mixed policy, set before any layer is built (Keras reads it at construction);
    // under mixed_float16 model.compile wraps the optimizer in a LossScaleOptimizer itself.
    const std::string policy = mixed ? "# Layers compute in 16 bits; variables stay float32.\n"
                                       "keras.mixed_precision.set_global_policy(" +
                                           quoted(precisionPolicyName(spec.compile.precision)) + ")\n\n"
                                     : std::string();
    std::ostringstream s;
    s << "#!/usr/bin/env python3\n"
      << "\"\"\"" << spec.name << ": a Keras model exported by TrainStudio.\n\n"
      << "The same graph as in the designer, built with the tf.keras functional API (same layer\n"
      << "names and attributes), compiled with the model's training settings and trained on\n"
      << "Fashion-MNIST. Needs TensorFlow 2 (tf.keras 2 or Keras 3).\n\n"
      << "    python3 " << pythonIdentifier(spec.name) << ".py [--epochs N] [--batch-size B]\n"
      << "\"\"\"\n"
      << "import argparse\n"
      << "import gzip\n"
      << "import os\n\n"
      << "import numpy as np\n"
      << "import tensorflow as tf\n"
      << "from tensorflow import keras\n"
      << "from tensorflow.keras import layers\n\n"
      << "# Keras 3 calls LeakyReLU's alpha negative_slope.\n"
      << "_KERAS3 = int(str(getattr(keras, \"__version__\", \"2\")).split(\".\")[0]) >= 3\n"
      << "_LEAKY_SLOPE = \"negative_slope\" if _KERAS3 else \"alpha\"\n\n"
      << policy
      << "BATCH_SIZE = " << spec.compile.batchSize << "\n"
      << "EPOCHS = " << spec.compile.epochs << "\n"
      << "NUM_CLASSES = 10\n\n\n"
      << "def _activation(name):\n"
      << "    \"\"\"TrainStudio's leaky_relu is Keras 3's (slope 0.2); tf.keras 2 has no such string.\"\"\"\n"
      << "    if name == \"leaky_relu\":\n"
      << "        return lambda x: tf.nn.leaky_relu(x, alpha=0.2)\n"
      << "    return name\n\n\n"
      << "def build_model():\n"
      << body.str() << "\n\n"
      << "def compile_model(model):\n"
      << "    model.compile(\n"
      << "        optimizer=keras.optimizers." << optimizerClass(type) << "(" << optArgs << "),\n"
      << "        loss=" << lossExpression(spec.compile) << ",\n"
      << "        metrics=" << literal(metrics) << ",\n"
      << "    )\n"
      << "    return model\n\n\n"
      << "def load_fashion_mnist():\n"
      << "    \"\"\"((x_train, y_train), (x_test, y_test)) as uint8 arrays: the IDX files of Debian's\n"
      << "    dataset-fashion-mnist (or $FASHION_MNIST_DIR) when present, else Keras' download.\"\"\"\n"
      << "    folder = os.environ.get(\"FASHION_MNIST_DIR\", \"/usr/share/datasets/fashion-mnist\")\n\n"
      << "    def idx(name):\n"
      << "        with gzip.open(os.path.join(folder, name), \"rb\") as f:\n"
      << "            data = f.read()\n"
      << "        rank = data[3]\n"
      << "        shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], \"big\") for i in range(rank))\n"
      << "        return np.frombuffer(data, np.uint8, offset=4 + 4 * rank).reshape(shape)\n\n"
      << "    if os.path.exists(os.path.join(folder, \"train-images-idx3-ubyte.gz\")):\n"
      << "        return ((idx(\"train-images-idx3-ubyte.gz\"), idx(\"train-labels-idx1-ubyte.gz\")),\n"
      << "                (idx(\"t10k-images-idx3-ubyte.gz\"), idx(\"t10k-labels-idx1-ubyte.gz\")))\n"
      << "    return keras.datasets.fashion_mnist.load_data()\n\n\n"
      << "def prepare(images, labels, input_shapes, loss):\n"
      << "    \"\"\"Scales pixels to [0, 1] (as TrainStudio does) and shapes them for each input.\"\"\"\n"
      << "    x = images.astype(\"float32\") / 255.0\n"
      << "    xs = []\n"
      << "    for shape in input_shapes:\n"
      << "        if int(np.prod(shape)) != 28 * 28:\n"
      << "            raise SystemExit(\"input shape %s does not hold a 28x28 Fashion-MNIST image\" % (shape,))\n"
      << "        xs.append(x.reshape((-1,) + tuple(shape)))\n"
      << "    y = labels.astype(\"int64\")\n"
      << "    if loss != \"sparse_categorical_crossentropy\":\n"
      << "        y = keras.utils.to_categorical(y, NUM_CLASSES)\n"
      << "    return (xs[0] if len(xs) == 1 else xs), y\n\n\n"
      << "def main():\n"
      << "    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])\n"
      << "    parser.add_argument(\"--epochs\", type=int, default=EPOCHS)\n"
      << "    parser.add_argument(\"--batch-size\", type=int, default=BATCH_SIZE)\n"
      << "    args = parser.parse_args()\n\n"
      << "    model = compile_model(build_model())\n"
      << "    model.summary()\n"
      << "    (x_train, y_train), (x_test, y_test) = load_fashion_mnist()\n"
      << "    input_shapes = " << inputShapes << "\n"
      << "    x_train, y_train = prepare(x_train, y_train, input_shapes, " << quoted(spec.compile.loss) << ")\n"
      << "    x_test, y_test = prepare(x_test, y_test, input_shapes, " << quoted(spec.compile.loss) << ")\n"
      << "    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,\n"
      << "              validation_data=(x_test, y_test))\n"
      << "    results = model.evaluate(x_test, y_test, batch_size=args.batch_size, verbose=0)\n"
      << "    print(dict(zip(model.metrics_names, np.atleast_1d(results).tolist())))\n\n\n"
      << "if __name__ == \"__main__\":\n"
      << "    main()\n";
    return s.str();
}

} // namespace ts
