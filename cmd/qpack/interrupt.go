package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"
)

// interrupted is the cause of a context cancelled by a signal.
type interrupted struct{ sig os.Signal }

func (i interrupted) Error() string { return "interrupted by " + signalName(i.sig) }

func signalName(s os.Signal) string {
	if s == os.Interrupt {
		return "SIGINT"
	}
	if s == syscall.SIGTERM {
		return "SIGTERM"
	}
	return s.String()
}

// interruptContext is cancelled by the first SIGINT or SIGTERM, with the signal as its cause, so
// that a command stops cleanly (removing its staging output); a second signal is not caught and
// ends the process at once. stop releases the signals.
func interruptContext() (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			signal.Stop(sigs)
			cancel(interrupted{s})
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel(nil)
	}
}

// interruptedExit turns the error of a command stopped by interruptContext into its message and
// the shell's exit code for the signal (130 for SIGINT, 143 for SIGTERM); other errors pass.
func interruptedExit(ctx context.Context, command string, err error, outcome string) error {
	var in interrupted
	if err == nil || !errors.As(context.Cause(ctx), &in) {
		return err
	}
	code := 130
	if in.sig == syscall.SIGTERM {
		code = 143
	}
	return cli.Exit(fmt.Sprintf("qpack %s: %s: stopped; %s", command, in, outcome), code)
}
