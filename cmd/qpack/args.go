package main

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// flagsFirst moves a command's flags in front of its positional arguments, so that
// `qpack convert SRC -o DST` works: urfave/cli stops parsing flags at the first positional
// argument. Flags that take a value keep it; everything after "--" stays positional.
func flagsFirst(app *cli.App, args []string) []string {
	if len(args) < 3 {
		return args
	}
	cmd := app.Command(args[1])
	if cmd == nil {
		return args
	}
	head := 2 // arguments kept in front: the program and command names
	for _, sub := range cmd.Subcommands {
		if sub.HasName(args[2]) { // `qpack export gguf SRC -o FILE`: reorder the subcommand's
			cmd, head = sub, 3
		}
	}
	takesValue := map[string]bool{}
	for _, f := range cmd.Flags {
		_, isBool := f.(*cli.BoolFlag)
		for _, name := range f.Names() {
			takesValue[name] = !isBool
		}
	}
	var flags, positional []string
	rest := args[head:]
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		switch {
		case a == "--":
			positional = append(positional, rest[i+1:]...)
			i = len(rest)
		case strings.HasPrefix(a, "-") && a != "-":
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if !strings.Contains(name, "=") && takesValue[name] && i+1 < len(rest) {
				i++
				flags = append(flags, rest[i])
			}
		default:
			positional = append(positional, a)
		}
	}
	out := append(append([]string{}, args[:head]...), flags...)
	return append(out, positional...)
}
