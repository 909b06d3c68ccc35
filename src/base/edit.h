/*
 * edit.h: how far a typed name is from a known one, for "did you mean" (settings, flags).
 * Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
 * adjacent characters, each 1. A name is a typo of another within kvr_edit_limit of it.
 * Pure: no allocation, any thread. Cost: O(len a x len b), names of at most 63 bytes (longer:
 * SIZE_MAX, never a typo).
 */
#ifndef KVR_BASE_EDIT_H
#define KVR_BASE_EDIT_H

#include <stddef.h>

size_t kvr_edit_distance(const char *a, const char *b);
/* The most edits a typo of a name of len bytes has: 2, or a quarter of a long name. */
static inline size_t kvr_edit_limit(size_t len) { return len / 4 > 2 ? len / 4 : 2; }

#endif
