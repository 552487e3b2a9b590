"""Leaves every layer may import (the standard library only): where code runs, background imports, lazy names, a ticker."""
