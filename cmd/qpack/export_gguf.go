package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/qpack-dev/qpack/ggufexport"
)

func exportGGUFCommand() *cli.Command {
	return &cli.Command{
		Name:      "gguf",
		Usage:     "write a checkpoint (plain or quantized) as a GGUF v3 file for llama.cpp and ollama",
		ArgsUsage: "SRC",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "output FILE.gguf (required)", Required: true},
			&cli.StringFlag{Name: "type", Value: "f16", Usage: "ggml type of float linear weights: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k … q6_k, iq4_nl, iq4_xs, iq3_s, iq3_xxs, iq2_s, iq1_m (ggml's fitting without an imatrix, as llama-quantize's)"},
			&cli.StringFlag{Name: "embed-type", Aliases: []string{"token-embedding-type"}, Value: "f16", Usage: "ggml type of token_embd (same choices)"},
			&cli.StringFlag{Name: "output-type", Aliases: []string{"output-tensor-type"}, Usage: "ggml type of output, the classifier (same choices; default: --embed-type)"},
			&cli.BoolFlag{Name: "requantize", Usage: "dequantize modules whose scheme maps onto no ggml type and quantize them again to --type (lossy)"},
			&cli.StringFlag{Name: "tokenizer-pre", Usage: "tokenizer.ggml.pre to write instead of the detected one (gpt-2, llama-bpe, qwen2, …)"},
			&cli.StringFlag{Name: "name", Usage: "general.name (default: the source directory's name)"},
			&cli.BoolFlag{Name: "overwrite", Usage: "replace the output file if it exists"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("export gguf needs exactly one SRC argument")
			}
			dst := c.String("output")
			if _, err := os.Stat(dst); err == nil && !c.Bool("overwrite") {
				return fmt.Errorf("%s exists (use --overwrite to replace it)", dst)
			}
			start := time.Now()
			entries, err := ggufexport.Export(c.Args().First(), dst, ggufexport.Options{
				Type: c.String("type"), EmbedType: c.String("embed-type"), OutputType: c.String("output-type"), Requantize: c.Bool("requantize"),
				TokenizerPre: c.String("tokenizer-pre"), Name: c.String("name"),
			})
			if err != nil {
				return err
			}
			st, err := os.Stat(dst)
			if err != nil {
				return err
			}
			summarizeExport(c.App.Writer, entries)
			fmt.Fprintf(c.App.Writer, "wrote %s: %d tensors, %.1f MB in %.2f s\n", dst, len(entries), float64(st.Size())/1e6, time.Since(start).Seconds())
			return nil
		},
	}
}

// summarizeExport prints how many tensors went which way, e.g. "28 Q4_K  repacked losslessly (q4_k)".
func summarizeExport(w io.Writer, entries []ggufexport.Entry) {
	count := map[string]int{}
	for _, e := range entries {
		count[fmt.Sprintf("%-5s %s", e.Type, e.How)]++
	}
	keys := make([]string, 0, len(count))
	for k := range count {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "%4d %s\n", count[k], k)
	}
}
