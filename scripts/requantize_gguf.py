"""Write a GGUF file's block-quantized matrices in another block type (dequantized by gguf-py, quantized again by
specchat's quantizer, ggml's own searches, where it has the type, else by gguf-py), everything else copied: a real
model in a type no file here ships, for benchmarks of that type's kernels (say the 1.5B in Q8_0, the type people
pick when they want a small model unharmed, or in Q5_K, most of a Q5_K_M file). With --llama-cpp, llama.cpp's own
quantizer writes it (llama-cpp-python's `llama_model_quantize`, from a Q8_0 or F16 source): its mixture of types,
the output layer kept at Q6_K, as files of that type ship.

    python scripts/requantize_gguf.py SOURCE.gguf OUT.gguf [--type q8_0|q4_0|q4_1|q5_0|q5_1|q5_k] [--llama-cpp]
    python scripts/requantize_gguf.py Q8_0.gguf OUT.gguf --type q2_k|q3_k_*|iq3_m|iq4_xs|q4_k_m --llama-cpp
    python scripts/requantize_gguf.py BF16.gguf OUT.gguf --type f16 --llama-cpp
    python scripts/requantize_gguf.py Q8_0.gguf OUT.gguf --type iq3_xxs --random

With --random (the IQ1-IQ3 types, which llama.cpp writes only from an importance matrix) every layer's matrix gets
random codes of that type in its shape, the embedding and output layer kept: a file for speed figures only, its
text noise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' helpers
from gguf_files import copy_fields, random_blocks, reader  # noqa: E402

from specchat.kernels.cpu.cpu_decoder import cpu_decoder

DENSE = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)
IQ_RANDOM = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--type", default="q8_0", choices=["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q5_k", "q2_k",
                                                           "q3_k_s", "q3_k_m", "q3_k_l", "iq3_m", "iq4_xs", "q4_k_m",
                                                           "f16", *(kind.lower() for kind in IQ_RANDOM)],
                        help="q2_k, q3_k_*, iq3_m, iq4_xs, q4_k_m, f16: --llama-cpp only; iq1_* - iq3_*: --random only")
    parser.add_argument("--llama-cpp", action="store_true", help="quantize with llama.cpp, as its files ship")
    parser.add_argument("--random", action="store_true", help="random codes of an IQ1-IQ3 type (speed figures)")
    args = parser.parse_args()
    if args.llama_cpp:
        return llama_cpp_quantize(args.source, args.out, args.type)
    if args.type.upper() in IQ_RANDOM:
        if not args.random:
            raise SystemExit(f"{args.type.upper()} needs an importance matrix to be quantized: add --random")
        return random_codes(args.source, args.out, GGMLQuantizationType[args.type.upper()])
    if args.type.startswith(("q2_k", "q3_k", "iq3_m", "iq4", "f16")):
        raise SystemExit(f"{args.type.upper()} files are written by llama.cpp's quantizer: add --llama-cpp")
    kind = GGMLQuantizationType[args.type.upper()]
    source = reader(args.source)
    architecture = bytes(source.fields["general.architecture"].parts[-1]).decode()
    writer = GGUFWriter(str(args.out), architecture)
    copy_fields(writer, args.source)
    for tensor in source.tensors:
        if tensor.tensor_type in DENSE:
            writer.add_tensor(tensor.name, np.array(tensor.data))
            continue
        values = dequantize(tensor.data, tensor.tensor_type)  # [rows, columns] float32
        if kind in (GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q5_0):
            blocks = cpu_decoder().gguf_quantize(torch.from_numpy(values), int(kind)).numpy()
        else:
            blocks = quantize(values, kind)
        writer.add_tensor(tensor.name, blocks, raw_dtype=kind)
        print(f"{tensor.name}: {tensor.tensor_type.name} -> {kind.name}", flush=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def random_codes(source_path: Path, out: Path, kind: GGMLQuantizationType) -> None:
    """`source_path` with every layer's block-quantized matrix random codes of `kind` (where its rows are whole
    blocks), the embedding and output layer as they are."""
    source = reader(source_path)
    writer = GGUFWriter(str(out), bytes(source.fields["general.architecture"].parts[-1]).decode())
    copy_fields(writer, source_path)
    rng = np.random.default_rng(0)
    for tensor in source.tensors:
        rows, columns = (int(n) for n in reversed(tensor.shape)) if len(tensor.shape) == 2 else (0, 0)
        if tensor.tensor_type in DENSE or not tensor.name.startswith("blk.") or columns % 256:
            writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=None if tensor.tensor_type in DENSE
                              else tensor.tensor_type)  # fmt: skip
            continue
        writer.add_tensor(tensor.name, random_blocks(kind, rows, columns, rng), raw_dtype=kind)
        print(f"{tensor.name}: {tensor.tensor_type.name} -> {kind.name} (random codes)", flush=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama_cpp_quantize(source: Path, out: Path, name: str) -> None:
    import ctypes

    import llama_cpp

    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name.upper()}", None)
    if ftype is None:
        raise SystemExit(f"llama.cpp has no file type {name} (it writes Q5_K as Q5_K_S / Q5_K_M)")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    if llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama.cpp could not quantize {source} to {name}")


if __name__ == "__main__":
    main()
