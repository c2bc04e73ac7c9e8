"""imgfab-quantize (rendered by imgfab 0.1.0): write a TensorRT-LLM checkpoint.

TensorRT-LLM's wheel ships no quantization command; its documented entry point is
examples/quantization/quantize.py, which parses these flags (same names, same defaults) and
calls tensorrt_llm.quantization.quantize_and_export. ``--qformat full_prec`` converts without
quantizing. flags checked against a stand-in table read from TensorRT-LLM 1.3.0rc3 source, not 1.2.1's wheel (confirmed: false).
"""

import argparse
import multiprocessing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float16", "bfloat16", "float32"])
    parser.add_argument("--qformat", default="full_prec",
                        choices=["nvfp4", "fp8", "fp8_pc_pt", "int8_sq", "int4_awq", "w4a8_awq",
                                 "int8_wo", "int4_wo", "full_prec"])
    parser.add_argument("--kv_cache_dtype", default=None, choices=["int8", "fp8"])
    parser.add_argument("--calib_dataset", default="cnn_dailymail")
    parser.add_argument("--calib_size", type=int, default=512)
    parser.add_argument("--tp_size", type=int, default=1)
    parser.add_argument("--pp_size", type=int, default=1)
    args = parser.parse_args()

    from tensorrt_llm.quantization import quantize_and_export

    # The remaining keyword arguments are quantize.py's defaults.
    quantize_and_export(model_dir=args.model_dir, device="cuda", calib_dataset=args.calib_dataset,
                        dtype=args.dtype, qformat=args.qformat, kv_cache_dtype=args.kv_cache_dtype,
                        calib_size=args.calib_size, batch_size=1, calib_max_seq_length=512,
                        awq_block_size=128, output_dir=args.output_dir, tp_size=args.tp_size,
                        pp_size=args.pp_size, cp_size=1, seed=1234, tokenizer_max_seq_length=2048)


if __name__ == "__main__":
    multiprocessing.set_start_method("spawn", force=True)
    main()
