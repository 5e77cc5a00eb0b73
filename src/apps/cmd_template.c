/* ==== strand template: render a chat template for a request ====
 *
 *   strand template (-m DIR | --template FILE) --request-file F [--name NAME]
 *
 * F is a JSON object {"messages": [...], "tools": [...], "add_generation_prompt": true,
 * ...extra keywords}. Prints the rendered prompt exactly (no newline added), as
 * transformers' apply_chat_template(tokenize=False) would. A template error (such as
 * raise_exception) goes to stderr with its template line, and the exit status is 1.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/cli.h"
#include "core/fileio.h"
#include "template/template.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: strand template (-m DIR | --template FILE) --request-file F [--name NAME]\n"
            "\n"
            "Render the chat template for a request and print the prompt text exactly.\n"
            "  -m, --model DIR      model directory (chat_template.jinja, chat_template.json or\n"
            "                       tokenizer_config.json, with that precedence)\n"
            "  --template FILE      a Jinja template file (a .json file is read like\n"
            "                       tokenizer_config.json / chat_template.json)\n"
            "  --request-file F     JSON {\"messages\": [...], \"tools\": [...],\n"
            "                       \"add_generation_prompt\": true, ...extra keywords}\n"
            "  --name NAME          use the named template (default: \"tool_use\" when tools\n"
            "                       are given and it exists, else \"default\")\n");
}

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *tfile = NULL, *req = NULL, *name = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--template")) {
            if (!(tfile = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--request-file")) {
            if (!(req = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--name")) {
            if (!(name = cli_value(argc, argv, &i))) return 2;
        } else {
            fprintf(stderr, "strand template: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if ((!model && !tfile) || (model && tfile) || !req) {
        usage(stderr);
        return 2;
    }
    st_error err;
    st_error_clear(&err);
    char *buf;
    size_t len;
    if (st_file_read(req, (size_t)256 << 20, &buf, &len, &err) != ST_OK) return cli_fail(&err);
    json_error_t je;
    json_t *request = json_loadb(buf, len, JSON_ALLOW_NUL, &je);
    free(buf);
    if (!request) return cli_failf("%s: invalid JSON at line %d: %s", req, je.line, st_json_error_text(je.text));
    if (!json_is_object(request) || !json_is_array(json_object_get(request, "messages"))) {
        json_decref(request);
        return cli_failf("%s: expected a JSON object with a \"messages\" list", req);
    }
    st_chat_template *ct = NULL;
    st_status st = model ? st_chat_template_load(model, name, NULL, &ct, &err)
                         : st_chat_template_load_file(tfile, name, NULL, &ct, &err);
    if (st != ST_OK) {
        json_decref(request);
        return cli_fail(&err);
    }
    char *out = NULL;
    size_t out_len = 0;
    st = st_chat_template_render_request(ct, request, &out, &out_len, &err);
    json_decref(request);
    if (st != ST_OK) {
        fprintf(stderr, "strand: template error (%s): %s\n", st_chat_template_origin(ct), err.msg);
        st_chat_template_free(ct);
        return 1;
    }
    st_chat_template_free(ct);
    size_t w = fwrite(out, 1, out_len, stdout);
    free(out);
    if (w != out_len || fflush(stdout) != 0) return cli_failf("writing the output failed");
    return 0;
}
