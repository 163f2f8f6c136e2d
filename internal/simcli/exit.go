package simcli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// Exit codes. Scripts rely on bad input being distinguishable from a failed run.
const (
	ExitOK         = 0
	ExitFailure    = 1
	ExitUsageError = 2
)

// UsageError marks an error caused by the user's input (flags, files); it exits with status 2.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// NewUsageError formats a UsageError.
func NewUsageError(format string, args ...any) error {
	return UsageError{Err: fmt.Errorf(format, args...)}
}

// IsUsageError reports whether err was caused by the user's input: a UsageError, or one of
// cobra's own argument errors, which are plain errors.
func IsUsageError(err error) bool {
	var ue UsageError
	if errors.As(err, &ue) {
		return true
	}
	msg := err.Error()
	for _, prefix := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "accepts ", "requires at least", "invalid argument"} {
		if strings.HasPrefix(msg, prefix) {
			return true
		}
	}
	return false
}

// Execute runs cmd with args and maps its error to an exit code; it never calls os.Exit, so
// tests can drive it.
func Execute(cmd *cobra.Command, args []string, stdout, stderr io.Writer) int {
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return UsageError{Err: err} })
	cmd.SetArgs(args)
	err := cmd.Execute()
	if err == nil {
		return ExitOK
	}
	fmt.Fprintf(stderr, "Error: %v\n", err)
	if IsUsageError(err) {
		return ExitUsageError
	}
	return ExitFailure
}
