// Runs a model exported by `qpack export onnx` in onnxruntime-node (CPU) for qpack's tests.
// usage: node ort.js MODEL_DIR REQUEST.json OUT.bin
// REQUEST: {"mode": "logits", "ids": [...], "split": 0}   logits [len(ids), vocab] float32 to OUT;
//          with split > 0 followed by the logits of the ids run as two chunks, the second
//          reading the first's KV cache.
//          {"mode": "nll", "seqs": [[...], ...]}          prints {"nll": Σ −log p(next), "tokens": n}.
// The session runs at graphOptimizationLevel "basic": the extended levels fuse
// DequantizeLinear→MatMul into MatMulNBits with int8 activations (accuracy_level 4 by default).
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

async function main() {
  const [dir, reqFile, outFile] = process.argv.slice(2);
  const req = JSON.parse(fs.readFileSync(reqFile, 'utf8'));
  const cfg = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8'));
  const layers = cfg.num_hidden_layers;
  const kvHeads = cfg.num_key_value_heads || cfg.num_attention_heads;
  const headDim = cfg.head_dim || cfg.hidden_size / cfg.num_attention_heads;
  const session = await ort.InferenceSession.create(path.join(dir, 'model.onnx'),
    {graphOptimizationLevel: req.level || 'basic', executionProviders: ['cpu']});

  const emptyPast = () => {
    const past = {};
    for (let i = 0; i < layers; i++) {
      for (const kind of ['key', 'value']) {
        past[`past_key_values.${i}.${kind}`] = new ort.Tensor('float32', new Float32Array(0), [1, kvHeads, 0, headDim]);
      }
    }
    return past;
  };
  // run feeds ids at positions start.. with the cache past; returns logits and the new cache.
  const run = async (ids, start, past) => {
    const n = ids.length;
    const feeds = Object.assign({}, past);
    feeds.input_ids = new ort.Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, n]);
    feeds.attention_mask = new ort.Tensor('int64', new BigInt64Array(start + n).fill(1n), [1, start + n]);
    feeds.position_ids = new ort.Tensor('int64', BigInt64Array.from(ids.map((_, i) => BigInt(start + i))), [1, n]);
    const out = await session.run(feeds);
    const next = {};
    for (let i = 0; i < layers; i++) {
      next[`past_key_values.${i}.key`] = out[`present.${i}.key`];
      next[`past_key_values.${i}.value`] = out[`present.${i}.value`];
    }
    return {logits: out.logits.data, cache: next};
  };

  if (req.mode === 'logits') {
    // One pass over ids, then (split > 0) the same ids as two chunks joined by the KV cache.
    const ids = req.ids;
    const parts = [(await run(ids, 0, emptyPast())).logits];
    if (req.split > 0) {
      const a = await run(ids.slice(0, req.split), 0, emptyPast());
      parts.push(a.logits, (await run(ids.slice(req.split), req.split, a.cache)).logits);
    }
    fs.writeFileSync(outFile, Buffer.concat(parts.map((p) => Buffer.from(p.buffer, p.byteOffset, p.byteLength))));
    return;
  }
  if (req.mode === 'nll') {
    const vocab = cfg.vocab_size;
    let nll = 0, tokens = 0;
    for (const seq of req.seqs) {
      const logits = (await run(seq, 0, emptyPast())).logits;
      for (let t = 0; t + 1 < seq.length; t++) {
        const row = logits.subarray(t * vocab, (t + 1) * vocab);
        let m = -Infinity;
        for (const v of row) m = Math.max(m, v);
        let s = 0;
        for (const v of row) s += Math.exp(v - m);
        nll -= row[seq[t + 1]] - m - Math.log(s);
        tokens++;
      }
    }
    fs.writeFileSync(outFile, JSON.stringify({nll, tokens}));
    return;
  }
  throw new Error(`unknown mode ${req.mode}`);
}

main().catch((e) => { console.error(e.message || e); process.exit(1); });
