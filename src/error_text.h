/*
** error_text.h: the text of an error object, shared by the two C modules
** (async_mutex.core and async_mutex.redis_core: each links its own copy
** of error_text.c, see the Makefile)
*/
#ifndef AM_ERROR_TEXT_H
#define AM_ERROR_TEXT_H

#include "lua.h"

/* Pushes and returns the text of the error object at 'idx': a string or
   a number as lua5.4 prints it, else its __tostring (called protected),
   else "(error object is a T value)". */
const char *am_push_error_text (lua_State *L, int idx);

#endif
