# Computes per-tensor checksums of the shared test models independently of qpack (plain Python,
# no safetensors library): SHA-256 of the raw bytes and float64 sums of the decoded values.
# Run: python3 checksums.py ../../../shared/models > checksums.json
import hashlib, json, os, struct, sys, array

def tensors(path):
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    for name, e in header.items():
        if name == '__metadata__':
            continue
        b, end = e['data_offsets']
        yield name, e['dtype'], e['shape'], data[b:end]

def values(dtype, raw):
    if dtype == 'F32':
        return array.array('f', raw)
    if dtype == 'BF16':
        halves = array.array('H', raw)
        return array.array('f', struct.pack('<%dI' % len(halves), *[h << 16 for h in halves]))
    raise SystemExit('unexpected dtype ' + dtype)

out = {}
root = sys.argv[1]
for model in ('tiny', 'small-llama'):
    d = os.path.join(root, model)
    for fn in sorted(os.listdir(d)):
        if not fn.endswith('.safetensors'):
            continue
        for name, dtype, shape, raw in tensors(os.path.join(d, fn)):
            v = values(dtype, raw)
            out[model + '/' + name] = {
                'dtype': dtype, 'shape': shape, 'file': fn,
                'sha256': hashlib.sha256(raw).hexdigest(),
                'sum': sum(float(x) for x in v), 'sumabs': sum(abs(float(x)) for x in v),
            }
json.dump(out, sys.stdout, indent=1, sort_keys=True)
