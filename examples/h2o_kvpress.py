"""Compress a model's KV cache with H2O (kvpress's ObservedAttentionPress) on FlashTensor's fused kernels.

kvpress's H2O press reads the attention weights of every layer, so it needs attn_implementation="eager", which
writes the batch x heads x S x S probabilities in each layer. FlashTensor's press is the same class with the
column sums computed inside the fused attention kernels instead; the one change is the import.

    python examples/h2o_kvpress.py                                  # a tiny random Llama, no download
    python examples/h2o_kvpress.py --model Qwen/Qwen3-0.6B --prompt "..."

Without a GPU the kernels run in Triton's interpreter (slow, for checking only).
"""
import argparse
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before triton is imported

from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, LlamaConfig  # noqa: E402

from flashtensor.integrations.kvpress import ObservedAttentionPress  # noqa: E402  (was: from kvpress import ...)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a Hugging Face model name; default: a tiny random Llama")
    parser.add_argument("--prompt", default="FlashTensor fuses the statistics a KV-cache press needs into attention.")
    parser.add_argument("--compression-ratio", type=float, default=0.5)
    parser.add_argument("--new-tokens", type=int, default=8)
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.model:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, device_map=device)
        inputs = tokenizer(args.prompt, return_tensors="pt").to(device)
    else:
        tokenizer, vocab = None, 128
        torch.manual_seed(0)    # the same weights and prompt every run (an unlucky draw greedily picks EOS first)
        config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, vocab_size=vocab, pad_token_id=0)
        model = AutoModelForCausalLM.from_config(config).to(device)
        ids = torch.randint(1, vocab, (1, 32), device=device)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    press = ObservedAttentionPress(compression_ratio=args.compression_ratio)
    cache = DynamicCache()
    with torch.no_grad(), press(model):     # prefill compresses the cache; decoding reads the compressed one
        out = model.generate(**inputs, past_key_values=cache, max_new_tokens=args.new_tokens, do_sample=False)

    prompt = inputs["input_ids"].shape[1]
    new = out[0, prompt:]
    print(f"prompt: {prompt} tokens; cache after generation: {cache.get_seq_length()} tokens per layer")
    print("generated:", tokenizer.decode(new) if tokenizer else new.tolist())


if __name__ == "__main__":
    main()
