"""Networks as torch's exporters write them (issue 33): transformers' BERT, GPT-2 and ViT with
tiny configurations, and a YOLOv8-style head, a CRNN recognizer, a byte classifier and a 1-D
convolutional audio network written in torch, each exported by the TorchScript exporter (opset
17) and the dynamo exporter (opset 18) with seeded weights (``torch_exports``: cached, so a
later run does not import torch), imported by kernelrpc, built for this host and checked against
onnxruntime within 1e-4 of the output's scale. Where torch cannot export a network, the case is
skipped with torch's error."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx_check import build, compare, run
from torch_exports import EXPORTERS, ExportRefused, Network, exported

from kernelrpc.relay.testing import onnxruntime_outputs

RNG = np.random.default_rng(33)
TOL = 1e-4


def _bert():
    from torch import nn
    from transformers import BertConfig, BertModel

    class LastHidden(nn.Module):
        """Keyword arguments: transformers 5's forward takes ``use_cache`` third, so the
        TorchScript exporter's positional call would give it twice."""

        def __init__(self):
            super().__init__()
            self.model = BertModel(BertConfig(
                vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128, max_position_embeddings=32))

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids,
                              attention_mask=attention_mask).last_hidden_state
    return LastHidden()


def _gpt2():
    from torch import nn
    from transformers import GPT2Config, GPT2Model

    class LastHidden(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = GPT2Model(GPT2Config(vocab_size=100, n_positions=32, n_embd=64,
                                              n_layer=2, n_head=4))

        def forward(self, input_ids):
            return self.model(input_ids=input_ids, use_cache=False).last_hidden_state
    return LastHidden()


def _vit():
    from torch import nn
    from transformers import ViTConfig, ViTModel

    class ClassToken(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = ViTModel(ViTConfig(
                image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=128), add_pooling_layer=False)

        def forward(self, pixel_values):
            return self.model(pixel_values=pixel_values).last_hidden_state[:, 0]
    return ClassToken()


def _yolo_head():
    import torch
    from torch import nn

    def conv(cin, cout, k=3, s=1):
        return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2), nn.SiLU())

    class Head(nn.Module):
        """Two levels (strides 8 and 16), boxes as distributions over 4 bins (DFL)."""
        bins, classes, strides = 4, 5, (8, 16)

        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(conv(3, 8, s=2), conv(8, 16, s=2), conv(16, 16, s=2))
            self.down = conv(16, 24, s=2)
            self.box = nn.ModuleList(nn.Sequential(conv(c, 16), nn.Conv2d(16, 4 * self.bins, 1))
                                     for c in (16, 24))
            self.cls = nn.ModuleList(nn.Sequential(conv(c, 16), nn.Conv2d(16, self.classes, 1))
                                     for c in (16, 24))
            self.dfl = nn.Conv2d(self.bins, 1, 1, bias=False).requires_grad_(False)
            self.dfl.weight.data[:] = torch.arange(self.bins, dtype=torch.float).view(
                1, self.bins, 1, 1)

        def forward(self, images):
            p3 = self.stem(images)
            levels = (p3, self.down(p3))
            outs, points, strides = [], [], []
            for level, feature, stride in zip(range(2), levels, self.strides):
                outs.append(torch.cat((self.box[level](feature), self.cls[level](feature)), 1)
                            .flatten(2))
                h, w = feature.shape[2:]
                sy = torch.arange(h, dtype=torch.float) + 0.5
                sx = torch.arange(w, dtype=torch.float) + 0.5
                gy, gx = torch.meshgrid(sy, sx, indexing="ij")
                points.append(torch.stack((gx, gy), -1).view(-1, 2))
                strides.append(torch.full((h * w, 1), stride, dtype=torch.float))
            anchors, stride_col = torch.cat(points).transpose(0, 1), torch.cat(strides).t()
            x = torch.cat(outs, 2)
            box, scores = x.split((4 * self.bins, self.classes), 1)
            b, _, a = box.shape
            dist = self.dfl(box.view(b, 4, self.bins, a).transpose(2, 1).softmax(1))
            lt, rb = dist.view(b, 4, a).chunk(2, 1)
            x1y1, x2y2 = anchors - lt, anchors + rb
            boxes = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * stride_col
            return torch.cat((boxes, scores.sigmoid()), 1)
    return Head()


def _crnn():
    from torch import nn

    class CRNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 16, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, 1, 1), nn.ReLU(), nn.MaxPool2d((2, 1)),
                nn.Conv2d(32, 32, 3, 1, 1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d((2, 1)),
                nn.Conv2d(32, 32, (4, 1)), nn.ReLU())
            self.rnn = nn.LSTM(32, 24, bidirectional=True)
            self.classify = nn.Linear(48, 37)
            norm = self.features[7]
            norm.running_mean.uniform_(-0.5, 0.5)                      # statistics as trained
            norm.running_var.uniform_(0.5, 2.0)

        def forward(self, image):
            seq = self.features(image).squeeze(2).permute(2, 0, 1)      # [width, batch, C]
            return self.classify(self.rnn(seq)[0]).log_softmax(-1)
    return CRNN()


def _byte_classifier():
    import torch
    from torch import nn

    class Bytes(nn.Module):
        def __init__(self):
            super().__init__()
            self.classify = nn.Linear(256, 7)

        def forward(self, data):
            hot = (data.unsqueeze(-1) == torch.arange(256)).float()
            return self.classify(hot.mean(1))
    return Bytes()


def _audio():
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Branch(nn.Module):
        def __init__(self, kernel):
            super().__init__()
            self.conv = nn.Conv1d(1, 16, kernel, 2, kernel // 2)
            self.grouped = nn.Conv1d(16, 16, 3, 1, 1, groups=4)
            self.rnn = nn.LSTM(16, 16, batch_first=True)
            self.out = nn.Linear(16, 1)

        def forward(self, x):
            h = F.relu(self.grouped(F.relu(self.conv(x.unsqueeze(1)))))
            h = F.max_pool1d(h, 2)
            h = self.rnn(h.transpose(1, 2))[0]
            return torch.sigmoid(self.out(h)).squeeze(-1)

    class Detector(nn.Module):
        """Voice activity per frame; the weights for 16 and 8 kHz chosen by the input ``sr``."""

        def __init__(self):
            super().__init__()
            self.high, self.low = Branch(5), Branch(3)

        def forward(self, x, sr):
            if not torch.jit.is_scripting():    # noqa: SIM102 - TorchScript skips this block only
                if torch.compiler.is_exporting():       # torch.export traces both branches
                    return torch.cond(sr == 16000, self.high, self.low, (x,))
            if bool(sr == 16000):
                return self.high(x)
            return self.low(x)
    return Detector()


def _mask(batch, length):
    mask = np.ones((batch, length), np.int64)
    mask[1, length - 4:] = 0
    return mask


TOKENS = {0: "batch", 1: "sequence"}
BATCH = {0: "batch"}
NETWORKS = {net.name: net for net in (
    Network("bert", _bert, {"input_ids": RNG.integers(0, 100, (2, 11)),
                            "attention_mask": _mask(2, 11)},
            needs=("transformers",), dynamic={"input_ids": TOKENS, "attention_mask": TOKENS}),
    Network("gpt2", _gpt2, {"input_ids": RNG.integers(0, 100, (2, 9))},
            needs=("transformers",), dynamic={"input_ids": TOKENS}),
    Network("vit", _vit, {"pixel_values": RNG.standard_normal((1, 3, 32, 32), np.float32)},
            needs=("transformers",)),
    Network("yolo_head", _yolo_head, {"images": RNG.standard_normal((1, 3, 64, 64), np.float32)},
            dynamic={"images": BATCH}),
    Network("crnn", _crnn, {"image": RNG.standard_normal((1, 1, 32, 40), np.float32)}),
    Network("byte_classifier", _byte_classifier, {"data": RNG.integers(0, 256, (2, 64))}),
    Network("audio", _audio, {"x": RNG.standard_normal((1, 160), np.float32),
                              "sr": np.asarray(16000, np.int64)}, script=True),
)}

def _cases():
    return [pytest.param(name, exporter, id=f"{name}-{exporter}")
            for name in NETWORKS if name != "audio" for exporter in EXPORTERS]


def exported_or_skip(name, exporter):
    """The network's ONNX model as ``exporter`` writes it; skipped with torch's error where
    torch cannot export it."""
    try:
        model = exported(NETWORKS[name], exporter)
    except ExportRefused as exc:
        pytest.skip(f"torch's {exporter} exporter cannot export {name}: {exc}")
    assert {o.domain: o.version for o in model.opset_import}[""] == EXPORTERS[exporter]
    return model


@pytest.mark.parametrize("name,exporter", _cases())
def test_exported_network_agrees_with_onnxruntime(name, exporter):
    model = exported_or_skip(name, exporter)
    net = NETWORKS[name]
    compare(run(build(model, shape=net.shapes), net.inputs),
            onnxruntime_outputs(model, net.inputs), TOL)


def _audio_feeds():
    """The example input at both sample rates."""
    return [{**NETWORKS["audio"].inputs, "sr": np.asarray(sr, np.int64)} for sr in (16000, 8000)]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_audio_network_branches_on_the_sample_rate_at_run_time(exporter):
    model = exported_or_skip("audio", exporter)
    module = build(model)
    expected = [onnxruntime_outputs(model, feeds) for feeds in _audio_feeds()]
    assert not np.allclose(expected[0][0], expected[1][0]), "the branches must differ"
    for feeds, want in zip(_audio_feeds(), expected):
        compare(run(module, feeds), want, TOL)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_audio_network_with_the_sample_rate_fixed_at_import(exporter):
    """``const_inputs``: the If folds to the branch of the given rate, ``sr`` is no input."""
    model = exported_or_skip("audio", exporter)
    for feeds in _audio_feeds():
        expected = onnxruntime_outputs(model, feeds)
        sr = int(feeds.pop("sr"))
        compare(run(build(model, const_inputs={"sr": sr}), feeds), expected, TOL)
