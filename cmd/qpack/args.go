package main

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// flagsFirst moves a command's flags in front of its positional arguments, so that
// `qpack convert SRC -o DST` works: urfave/cli stops parsing flags at the first positional
// argument. Flags that take a value keep it; everything after "--" stays positional.
func flagsFirst(app *cli.App, args []string) []string {
	at := 1 // the command name, after the app's own flags (--cpuprofile FILE)
	appValues := valueFlags(app.Flags)
	for at < len(args) && strings.HasPrefix(args[at], "-") {
		if name := strings.TrimLeft(args[at], "-"); appValues[name] {
			at++
		}
		at++
	}
	if at+1 >= len(args) {
		return args
	}
	cmd := app.Command(args[at])
	if cmd == nil {
		return args
	}
	head := at + 1 // arguments kept in front: the program, the app's flags and the command name
	for _, sub := range cmd.Subcommands {
		if sub.HasName(args[head]) { // `qpack export gguf SRC -o FILE`: reorder the subcommand's
			cmd = sub
			head++
			break
		}
	}
	takesValue := valueFlags(cmd.Flags)
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

// valueFlags says, by every name of each flag, whether it takes a value.
func valueFlags(flags []cli.Flag) map[string]bool {
	takesValue := map[string]bool{}
	for _, f := range flags {
		_, isBool := f.(*cli.BoolFlag)
		for _, name := range f.Names() {
			takesValue[name] = !isBool
		}
	}
	return takesValue
}
