# embed.cmake: writes OUT, a C file defining NAME (the bytes of IN) and NAME_len (their count),
# so a file (the live page, src/ui/page.html) is compiled into the binary with no tool beyond
# CMake. Run as: cmake -DIN=... -DOUT=... -DNAME=... -P embed.cmake
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" digits)
math(EXPR bytes "${digits} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" body "${body}")
file(WRITE ${OUT}.tmp "/* Written by scripts/embed.cmake from ${IN}: do not edit. */\n"
  "#include <stddef.h>\n"
  "extern const unsigned char ${NAME}[];\nextern const size_t ${NAME}_len;\n"
  "const unsigned char ${NAME}[] = {\n${body}0};\n"
  "const size_t ${NAME}_len = ${bytes};\n")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}.tmp)
