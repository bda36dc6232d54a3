package fleet

import "fmt"

// fieldError names a settings field, its value and what it must be.
func fieldError(field string, value any, rule string) error {
	return fmt.Errorf("fleet: %s = %v: %s", field, value, rule)
}
