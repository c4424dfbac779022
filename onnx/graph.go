package onnx

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
)

// Graph collects the nodes, initializers, inputs and outputs of one ONNX graph. Initializers
// larger than inlineMax bytes go to the external data file as they are added, so the weights
// are never all in memory; smaller ones stay inside the model file.
type Graph struct {
	nodes, inits, inputs, outputs [][]byte
	count                         int
	consts                        map[string]string

	data     *bufio.Writer
	dataFile *os.File
	dataName string // the data file's name relative to the model
	offset   int64
	Bytes    int64 // initializer bytes written so far, inline and external
}

// inlineMax is the largest initializer kept inside the model file.
const inlineMax = 1024

// dataAlign aligns external tensors so that the runtime can map them.
const dataAlign = 4096

// newGraph starts a graph whose external data goes to path, named dataName in the model.
func newGraph(path, dataName string) (*Graph, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &Graph{data: bufio.NewWriterSize(f, 1<<20), dataFile: f, dataName: dataName, consts: map[string]string{}}, nil
}

// closeData flushes and closes the external data file.
func (g *Graph) closeData() error {
	err := g.data.Flush()
	if err2 := g.dataFile.Close(); err == nil {
		err = err2
	}
	return err
}

// name returns a fresh value name with the given stem.
func (g *Graph) name(stem string) string {
	g.count++
	return stem + "_" + strconv.Itoa(g.count)
}

// Op adds a node of the default domain with one output and returns the output's name.
func (g *Graph) Op(op string, inputs []string, attrs ...Attr) string {
	out := g.name(op)
	g.nodes = append(g.nodes, nodeProto(out, op, "", inputs, []string{out}, attrs))
	return out
}

// OpTo adds a node whose outputs are named by the caller.
func (g *Graph) OpTo(op, domain string, inputs, outputs []string, attrs ...Attr) {
	g.nodes = append(g.nodes, nodeProto(g.name(op), op, domain, inputs, outputs, attrs))
}

// Input declares a graph input.
func (g *Graph) Input(name string, elem int32, dims ...Dim) string {
	g.inputs = append(g.inputs, valueInfo(name, elem, dims))
	return name
}

// Output declares a graph output.
func (g *Graph) Output(name string, elem int32, dims ...Dim) {
	g.outputs = append(g.outputs, valueInfo(name, elem, dims))
}

// Init adds an initializer holding raw little-endian data (packed for 4- and 2-bit types).
func (g *Graph) Init(name string, dtype int32, dims []int64, raw []byte) (string, error) {
	t := tensorHeader(name, dtype, dims)
	g.Bytes += int64(len(raw))
	if len(raw) <= inlineMax {
		g.inits = append(g.inits, appendBytes(t, 9, raw))
		return name, nil
	}
	pad := (dataAlign - g.offset%dataAlign) % dataAlign
	if _, err := g.data.Write(make([]byte, pad)); err != nil {
		return "", err
	}
	g.offset += pad
	if _, err := g.data.Write(raw); err != nil {
		return "", fmt.Errorf("writing %s to %s: %w", name, g.dataName, err)
	}
	t = appendBytes(t, 13, stringEntry("location", g.dataName))
	t = appendBytes(t, 13, stringEntry("offset", strconv.FormatInt(g.offset, 10)))
	t = appendBytes(t, 13, stringEntry("length", strconv.Itoa(len(raw))))
	t = appendInt(t, 14, 1) // data_location = EXTERNAL
	g.offset += int64(len(raw))
	g.inits = append(g.inits, t)
	return name, nil
}

// Float32s adds a FLOAT initializer.
func (g *Graph) Float32s(name string, v []float32, dims ...int64) (string, error) {
	raw := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(x))
	}
	return g.Init(name, Float, dims, raw)
}

// Int64s returns a 1-D INT64 constant.
func (g *Graph) Int64s(v ...int64) string {
	raw := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(raw[8*i:], uint64(x))
	}
	return g.constant(Int64, []int64{int64(len(v))}, raw)
}

// Int64Scalar returns an INT64 scalar (rank 0) constant.
func (g *Graph) Int64Scalar(v int64) string {
	return g.constant(Int64, nil, binary.LittleEndian.AppendUint64(nil, uint64(v)))
}

// Scalar returns a FLOAT scalar constant.
func (g *Graph) Scalar(f float32) string {
	return g.constant(Float, nil, binary.LittleEndian.AppendUint32(nil, math.Float32bits(f)))
}

// constant adds a small inline initializer once per distinct (type, shape, data).
func (g *Graph) constant(dtype int32, dims []int64, raw []byte) string {
	key := fmt.Sprint(dtype, dims, raw)
	if name, ok := g.consts[key]; ok {
		return name
	}
	name := g.name("const")
	g.inits = append(g.inits, appendBytes(tensorHeader(name, dtype, dims), 9, raw))
	g.consts[key] = name
	return name
}

// model encodes the ModelProto around the graph.
func (g *Graph) model(irVersion int64, opsets map[string]int64, producer, version string, meta map[string]string) []byte {
	var gb []byte
	for _, n := range g.nodes {
		gb = appendBytes(gb, 1, n)
	}
	gb = appendStr(gb, 2, "qpack")
	for _, t := range g.inits {
		gb = appendBytes(gb, 5, t)
	}
	for _, v := range g.inputs {
		gb = appendBytes(gb, 11, v)
	}
	for _, v := range g.outputs {
		gb = appendBytes(gb, 12, v)
	}
	m := appendInt(nil, 1, irVersion)
	m = appendStr(m, 2, producer)
	m = appendStr(m, 3, version)
	m = protowire.AppendTag(m, 7, protowire.BytesType)
	m = protowire.AppendBytes(m, gb)
	for _, domain := range sortedKeys(opsets) {
		op := appendStr(nil, 1, domain)
		op = appendInt(op, 2, opsets[domain])
		m = appendBytes(m, 8, op)
	}
	for _, k := range sortedOf(meta) {
		m = appendBytes(m, 14, stringEntry(k, meta[k]))
	}
	return m
}

func sortedKeys(m map[string]int64) []string { return sortedOf(m) }

func sortedOf[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
