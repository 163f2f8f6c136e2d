package weights

import (
	"fmt"
	"os"
)

var debugOn = os.Getenv("ALB_DEBUG") != ""

func debugf(format string, args ...any) {
	if debugOn {
		fmt.Fprintf(os.Stderr, format, args...)
	}
}
