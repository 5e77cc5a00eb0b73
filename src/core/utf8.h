/* ==== UTF-8: validation and counting ====
 * One definition of valid UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above
 * U+10FFFF) for every module that takes text from outside. */
#ifndef ST_CORE_UTF8_H
#define ST_CORE_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the valid UTF-8 prefix of s[0..n): n when all of it is valid, else the offset of
 * the first byte that does not begin a valid sequence. */
size_t st_utf8_check(const void *s, size_t n);

/* Length (1-4) of the valid sequence at s[0..n), its code point in *cp (may be NULL); 0 when
 * s does not start with a valid sequence. */
int st_utf8_seq(const uint8_t *s, size_t n, uint32_t *cp);

/* For a lead byte b0 of a multi-byte sequence: its length and the allowed range of the
 * second byte; 0 when b0 cannot begin one (ASCII, continuation bytes, C0, C1, F5..FF). */
int st_utf8_lead(uint8_t b0, uint8_t *lo, uint8_t *hi, int *len);

/* Characters in s[0..n): the bytes that are not continuation bytes. */
size_t st_utf8_count(const void *s, size_t n);

#endif /* ST_CORE_UTF8_H */
